/* OpenAI batch JSONL: request lines in, result/error lines out (the shape OpenAI's Batch
 * API and vLLM's run_batch use), and the resume scan of an existing output file.
 *
 * Record keys. Every input line ends in exactly one output record. A record is keyed by its
 * custom_id, except when the line gave no usable one (invalid JSON, missing or non-string
 * custom_id, a custom_id already used by an earlier line): then by its 1-based line number,
 * carried in error.line. A restarted job skips every line whose key is already in the
 * output, so a kill neither duplicates nor loses a record (given the same input file). */
#ifndef TSR_JOBS_BATCH_IO_H
#define TSR_JOBS_BATCH_IO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "runtime/text/chat_template.h"

/* ---- a set of strings (custom_ids, line keys) ------------------------------------------ */

typedef struct tsr_strset tsr_strset;
tsr_status tsr_strset_create(tsr_strset **out);
void tsr_strset_destroy(tsr_strset *s);
/* Adds a copy of key; *added (may be NULL) tells whether it was new. */
tsr_status tsr_strset_add(tsr_strset *s, const char *key, bool *added);
bool tsr_strset_has(const tsr_strset *s, const char *key);
int64_t tsr_strset_count(const tsr_strset *s);

/* ---- requests --------------------------------------------------------------------------- */

typedef enum tsr_batch_kind {
    TSR_BATCH_COMPLETION = 0, /* /v1/completions, body.prompt */
    TSR_BATCH_CHAT = 1,       /* /v1/chat/completions, body.messages */
} tsr_batch_kind;

#define TSR_BATCH_MAX_STOPS 16

typedef struct tsr_batch_request {
    int64_t line;           /* 1-based input line */
    char *custom_id;        /* NULL when the line has no usable one */
    tsr_batch_kind kind;
    char *prompt;           /* completions */
    tsr_chat_message *messages; /* chat (strings owned by the request) */
    int n_messages;
    int max_tokens;         /* default 16 (OpenAI's default) */
    float temperature;      /* default 1 */
    float top_p;            /* default 1 */
    bool has_seed;
    uint64_t seed;
    int n_stops;
    char *stops[TSR_BATCH_MAX_STOPS];
} tsr_batch_request;

/* Error codes used in error records (error.code). */
#define TSR_BATCH_E_JSON "invalid_json"
#define TSR_BATCH_E_CUSTOM_ID "missing_custom_id"
#define TSR_BATCH_E_DUPLICATE "duplicate_custom_id"
#define TSR_BATCH_E_METHOD "invalid_method"
#define TSR_BATCH_E_URL "invalid_url"
#define TSR_BATCH_E_BODY "missing_body"
#define TSR_BATCH_E_PROMPT "missing_prompt"
#define TSR_BATCH_E_MESSAGES "invalid_messages"
#define TSR_BATCH_E_PARAM "invalid_parameter"
#define TSR_BATCH_E_TOO_LONG "prompt_too_long"
#define TSR_BATCH_E_TEMPLATE "no_chat_template"
#define TSR_BATCH_E_INTERNAL "internal_error"

typedef struct tsr_batch_error {
    char code[32];
    char message[512];
} tsr_batch_error;

/* Parses one input line (without its newline). TSR_OK: *req is a valid request.
 * TSR_ERR_INVALID: *err says why, and req->custom_id is set when the line had a usable
 * one (the error record is keyed by it) or NULL (keyed by the line). Other statuses:
 * out of memory. Free *req with tsr_batch_request_free in every case. */
tsr_status tsr_batch_parse_line(const char *text, size_t len, int64_t line,
                                tsr_batch_request *req, tsr_batch_error *err);
void tsr_batch_request_free(tsr_batch_request *req);

/* ---- records ---------------------------------------------------------------------------- */

typedef struct tsr_batch_result {
    const char *custom_id;
    tsr_batch_kind kind;
    const char *model;         /* body.model */
    const char *text;          /* completion (any bytes; invalid UTF-8 becomes U+FFFD) */
    size_t text_len;
    const char *finish_reason; /* "stop" | "length" */
    int prompt_tokens, completion_tokens;
} tsr_batch_result;

/* One output line, '\n'-terminated, caller frees (tsr_free). NULL: out of memory. */
char *tsr_batch_format_result(const tsr_batch_result *r);
/* custom_id NULL: keyed by line (see the top of this file); `line` is always recorded. */
char *tsr_batch_format_error(const char *custom_id, int64_t line, const char *code,
                             const char *message);

/* The deterministic "batch_req_<16 hex>" id of a record (FNV-1a of its key). */
void tsr_batch_record_id(const char *custom_id, int64_t line, char *buf, size_t cap);

/* ---- input file ------------------------------------------------------------------------- */

/* Reads f (the input file at `path`) from where it stands to the end: checks that it is
 * UTF-8, the encoding JSON requires, and counts its requests (non-blank lines). A UTF-16 or
 * UTF-32 byte-order mark, a NUL byte (UTF-16 without a mark, a binary file) or a byte
 * sequence that is not UTF-8 refuses the whole file (TSR_ERR_INVALID, one line naming the
 * file, the line and the problem), so that no job presents a run of invalid_json records as
 * its result. A UTF-8 byte-order mark is allowed: *start gets its length (3), the offset the
 * reader should begin at, else 0. */
tsr_status tsr_batch_input_scan(const char *path, FILE *f, int64_t *n_requests, long *start);

/* ---- output file ------------------------------------------------------------------------ */

typedef struct tsr_batch_resume {
    tsr_strset *ids;    /* custom_ids with a record */
    tsr_strset *lines;  /* decimal line numbers of line-keyed records */
    int64_t n_records;  /* complete records found */
    int64_t n_errors;   /* of which error records */
    int64_t n_ignored;  /* complete lines that are not records (left in place, warned) */
    int64_t truncated_bytes; /* partial last line cut away */
} tsr_batch_resume;

/* Scans an existing output file (a missing file is an empty scan), truncates a final line
 * that lacks its newline (a record cut by a kill), and fills *r. Free with
 * tsr_batch_resume_free. */
tsr_status tsr_batch_resume_scan(const char *path, tsr_batch_resume *r);
void tsr_batch_resume_free(tsr_batch_resume *r);
bool tsr_batch_resume_has(const tsr_batch_resume *r, const char *custom_id, int64_t line);

/* Writes every error record of the output file to err_path (tmp + rename), so the errors
 * file agrees with the output after a restart. */
tsr_status tsr_batch_rebuild_errors(const char *out_path, const char *err_path);

/* An append-only JSONL file: each record is written, flushed and fsynced before the call
 * returns, so a record is either complete on disk or (cut by a kill) a truncated last line
 * the next scan removes. */
typedef struct tsr_batch_writer {
    FILE *f;
    char *path;
} tsr_batch_writer;
tsr_status tsr_batch_writer_open(tsr_batch_writer *w, const char *path);
tsr_status tsr_batch_writer_put(tsr_batch_writer *w, const char *line);
void tsr_batch_writer_close(tsr_batch_writer *w);

#endif
