/* libFuzzer target: one JSONL request line (jobs/run/batch_io.c, tsr_batch_parse_line), given
 * as exactly its bytes (no terminator), then the record the job would write for it: the
 * error record for a refused line, a result record echoing the request for an accepted one. */
#include "tests/fuzz/fuzz_util.h"

#include "base/alloc.h"
#include "jobs/run/batch_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *line = tsr_fuzz_copy(data, size);
    tsr_batch_request req;
    tsr_batch_error err;
    memset(&req, 0, sizeof req);
    memset(&err, 0, sizeof err);
    tsr_status st = tsr_batch_parse_line(line, size, 7, &req, &err);
    char *rec = NULL;
    if (st == TSR_OK) {
        const char *text = req.kind == TSR_BATCH_CHAT && req.n_messages > 0
                               ? req.messages[req.n_messages - 1].content
                               : req.prompt;
        tsr_batch_result r = {.custom_id = req.custom_id, .kind = req.kind, .model = "fuzz",
                              .text = text ? text : "", .text_len = text ? strlen(text) : 0,
                              .finish_reason = "stop", .prompt_tokens = 1,
                              .completion_tokens = req.max_tokens};
        rec = tsr_batch_format_result(&r);
    } else if (st == TSR_ERR_INVALID) {
        if (!memchr(err.code, 0, sizeof err.code) || !memchr(err.message, 0, sizeof err.message))
            abort(); /* the error must be a terminated string */
        rec = tsr_batch_format_error(req.custom_id, req.line, err.code, err.message);
    }
    char id[64];
    tsr_batch_record_id(req.custom_id, req.line, id, sizeof id);
    tsr_free(rec);
    tsr_batch_request_free(&req);
    free(line);
    return 0;
}
