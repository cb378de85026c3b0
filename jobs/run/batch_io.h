/* OpenAI batch JSONL: request lines in, result/error lines out (the shape OpenAI's Batch
 * API and vLLM's run_batch use), and the resume scan of an existing output file.
 *
 * Record keys. Every input line ends in exactly one output record. A record is keyed by its
 * custom_id, except when the line gave no usable one (invalid JSON, missing or non-string
 * custom_id, a custom_id already used by an earlier line): then by its 1-based line number,
 * carried in error.line. Every record also carries the hash of its input line (line_hash).
 * A restarted job skips every line whose key and line hash are already in the output, so a
 * kill neither duplicates nor loses a record, and an edited line is computed again
 * (tsr_batch_resume_scan_bound). */
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
    /* chat with function tools (body.tools, unless tool_choice is "none"), tool messages or
     * assistant tool_calls: the template's context, {"messages": [...], "tools": [...]}
     * (owned; contents as strings), rendered instead of `messages`. NULL otherwise. */
    cJSON *chat_ctx;
    /* tool_choice "required" or a named function ({"type": "function", "function":
     * {"name": ...}}, one of `tools`): the answer must be a call (forced on harmony models,
     * runtime/text/harmony.h tsr_harmony_force_call); force_name NULL for "required" */
    bool force_call;
    char *force_name;
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
#define TSR_BATCH_E_TOOLS "invalid_tools"         /* tools or tool_choice malformed */
#define TSR_BATCH_E_TOOLS_UNSUP "unsupported_tools" /* tools the model's format cannot say */
#define TSR_BATCH_E_INTERNAL "internal_error"
#define TSR_BATCH_E_ENCODING "invalid_encoding" /* the line is not UTF-8 */

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
    const char *finish_reason; /* "stop" | "length" | "tool_calls" */
    int prompt_tokens, completion_tokens;
    /* Chat records of a harmony model (GPT-OSS): the analysis channel's text as the
     * message's "reasoning" (NULL: none), and a tool call (tool_name NULL: none) as its
     * "tool_calls" list of one function call; with a call and no text, "content" is null. */
    const char *reasoning;
    size_t reasoning_len;
    const char *tool_name, *tool_args;
    size_t tool_name_len, tool_args_len;
    uint64_t line_hash; /* tsr_batch_line_hash of its input line; 0: not recorded */
} tsr_batch_result;

/* One output line, '\n'-terminated, caller frees (tsr_free). NULL: out of memory. */
char *tsr_batch_format_result(const tsr_batch_result *r);

/* A harmony chat answer (raw[0, n), the decoded text; `called`: generation ended with
 * <|call|>, runtime/text/harmony.h) as res's parts: text the final channel's ("" when
 * none), reasoning the analysis messages' text (joined by a blank line, in *reasoning, which
 * the caller frees; NULL when none), and a tool call (a message to=functions.NAME ended by
 * <|call|>) with finish_reason "tool_calls" when res's was "stop". Points into raw. */
tsr_status tsr_batch_result_harmony(tsr_batch_result *res, const char *raw, size_t n,
                                    bool called, char **reasoning);
/* custom_id NULL: keyed by line (see the top of this file); `line` is always recorded. */
char *tsr_batch_format_error(const char *custom_id, int64_t line, const char *code,
                             const char *message);

/* The same, bound to its input line by line_hash (0: not recorded). */
char *tsr_batch_format_error_bound(const char *custom_id, int64_t line, uint64_t line_hash,
                                   const char *code, const char *message);

/* The hash that binds a record to its input line: FNV-1a 64 of the line's bytes without its
 * line end, written in the record as "line_hash": "<16 hex>". Never 0. */
uint64_t tsr_batch_line_hash(const char *text, size_t len);

/* The deterministic "batch_req_<16 hex>" id of a record (FNV-1a of its key). */
void tsr_batch_record_id(const char *custom_id, int64_t line, char *buf, size_t cap);

/* ---- input file ------------------------------------------------------------------------- */

/* Reads f (the input file at `path`) from where it stands to the end and counts its requests
 * (non-blank lines). A file in another encoding refuses the whole job (TSR_ERR_INVALID, one
 * line naming the file and the problem), so that no job presents a run of error records as
 * its result: a UTF-16 or UTF-32 byte-order mark, or a NUL byte in the first line (UTF-16
 * without a mark, a binary file). A later line that is not UTF-8 is one bad line: it gets an
 * invalid_encoding error record (tsr_batch_take_line). A UTF-8 byte-order mark is allowed:
 * *start gets its length (3), the offset the reader should begin at, else 0. */
tsr_status tsr_batch_input_scan(const char *path, FILE *f, int64_t *n_requests, long *start);

/* One input line as the job takes it (shared by the job's reader and the input index, so
 * both key a line the same way). buf/n: the line as read (its line end is cut here).
 * *blank: a blank line (not a request; nothing else is set). Else *hash gets its
 * tsr_batch_line_hash, *verdict TSR_OK (a valid request in *r) or TSR_ERR_INVALID (*e says
 * why; r->custom_id is the record's key, NULL: keyed by line). A line that is not UTF-8 is
 * invalid_encoding, keyed by its custom_id when the line still parses with a UTF-8 one. A
 * custom_id already in `seen` is duplicate_custom_id (keyed by line); new ones are added.
 * Returns other statuses for out of memory only. Free *r in every case. */
tsr_status tsr_batch_take_line(char *buf, size_t n, int64_t line, tsr_strset *seen, bool *blank,
                               uint64_t *hash, tsr_batch_request *r, tsr_batch_error *e,
                               tsr_status *verdict);

/* What the input holds, for binding an existing output to it: every record key (a custom_id,
 * or "#line N" for a line-keyed one) and every key with its line hash. */
typedef struct tsr_batch_input_index {
    tsr_strset *keys;
    tsr_strset *pairs; /* "<key>\x1f<16 hex line hash>" */
    int64_t n_lines;
} tsr_batch_input_index;
/* Reads f from where it stands to the end. */
tsr_status tsr_batch_input_index_build(const char *path, FILE *f, tsr_batch_input_index *ix);
void tsr_batch_input_index_free(tsr_batch_input_index *ix);

/* ---- output file ------------------------------------------------------------------------ */

typedef struct tsr_batch_resume {
    tsr_strset *ids;    /* custom_ids with a record */
    tsr_strset *lines;  /* decimal line numbers of line-keyed records */
    int64_t n_records;  /* complete records found */
    int64_t n_errors;   /* of which error records */
    int64_t n_ignored;  /* complete lines that are not records (left in place, warned) */
    int64_t truncated_bytes; /* partial last line cut away (or to cut: tsr_batch_resume_fix) */
    int64_t good_end;        /* bytes up to the end of the last complete line */
    /* Bound to an input (tsr_batch_resume_scan_bound): */
    int64_t n_superseded; /* records of input lines that changed since (removed) */
    int64_t n_foreign;    /* records of requests the input does not have */
    char first_foreign[128]; /* the key of the first of those */
} tsr_batch_resume;

/* Scans an existing output file (a missing file is an empty scan), truncates a final line
 * that lacks its newline (a record cut by a kill), and fills *r. Free with
 * tsr_batch_resume_free. */
tsr_status tsr_batch_resume_scan(const char *path, tsr_batch_resume *r);
/* The same, bound to the input: a record counts (its key in *r, its line skipped) only when
 * its key and line_hash are those of an input line. A record of an input key with another
 * hash, or none, is superseded: its line changed since, so it is to be removed from the
 * output and the line computed again. A record whose key the input lacks (a custom_id not in
 * it, a line past its end) is foreign: n_foreign counts them (the caller refuses: the output
 * belongs to another input). `writable`: the partial last line is cut and the superseded
 * records removed here (when no record is foreign); else the file is only read, and
 * tsr_batch_resume_fix does both later (once the job knows it will run). */
tsr_status tsr_batch_resume_scan_bound(const char *path, const tsr_batch_input_index *ix,
                                       bool writable, tsr_batch_resume *r);
/* Cuts the partial last line and removes the superseded records (the output is written
 * again through a temporary and a rename) that a read-only bound scan found. */
tsr_status tsr_batch_resume_fix(const char *path, const tsr_batch_input_index *ix,
                                tsr_batch_resume *r);
void tsr_batch_resume_free(tsr_batch_resume *r);
bool tsr_batch_resume_has(const tsr_batch_resume *r, const char *custom_id, int64_t line);

/* Writes every error record of the output file to err_path (tmp + rename), so the errors
 * file agrees with the output after a restart. */
tsr_status tsr_batch_rebuild_errors(const char *out_path, const char *err_path);

/* An append-only JSONL file: each record is written and fsynced before the call returns, so
 * a record is either complete on disk or (cut by a kill) a truncated last line the next scan
 * removes. A failed write or fsync (ENOSPC, EDQUOT, EIO) truncates the file back to the end
 * of the last whole record before it returns TSR_ERR_IO, and sets `failed_errno`. */
typedef struct tsr_batch_writer {
    int fd;
    char *path;
    int64_t good;     /* bytes of whole records in the file */
    int64_t n_put;    /* records written by this writer */
    int failed_errno; /* the errno of the failed write, 0 if none */
} tsr_batch_writer;
tsr_status tsr_batch_writer_open(tsr_batch_writer *w, const char *path);
tsr_status tsr_batch_writer_put(tsr_batch_writer *w, const char *line);
void tsr_batch_writer_close(tsr_batch_writer *w);

/* ---- the job's lock on a file ----------------------------------------------------------- */

/* An exclusive lock on `file` for the job's life: a POSIX record lock (fcntl F_SETLK) on the
 * lock file "<file>.lock" beside it, which holds the holder's "pid@host" while it is held.
 * Taken: TSR_OK. Held by another job: TSR_ERR_INVALID with one line naming the holder.
 * Released (and the lock file removed) by tsr_batch_lock_release or the process's exit. */
typedef struct tsr_batch_lock {
    int fd;
    char *path; /* the lock file */
} tsr_batch_lock;
tsr_status tsr_batch_lock_take(tsr_batch_lock *l, const char *file);
void tsr_batch_lock_release(tsr_batch_lock *l);

#endif
