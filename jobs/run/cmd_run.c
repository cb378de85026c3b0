/* `tessera run`: offline bulk generation. OpenAI batch JSONL in, one record per input line
 * out (appended, flushed and fsynced as each request finishes), continuous batching through
 * runtime/exec/scheduler.h, progress on stderr and an optional metrics JSON. Rank 0 locks the
 * output and errors file for the job's life. A restarted job skips the lines whose records
 * (same key, same line_hash) are already in the output, recomputes edited lines and refuses
 * another input's output (jobs/run/batch_io.h), so it can be killed at any moment. Exit
 * codes: 0 when the job ran (bad lines are error records, not failures), 1 for fatal errors
 * (unreadable input or model, an output unwritable, locked or another input's, a write
 * error mid-run, a failed forward pass), 2 for usage errors, 3 (TSR_EXIT_STOPPED) when SIGTERM/SIGINT/SIGUSR1
 * stopped it between steps with work left (a rerun resumes). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobs/run/batch_io.h"
#include "jobs/run/checkpoint.h"
#include "jobs/run/run_job.h"
#include "jobs/cli.h"
#include "jobs/commands.h"
#include "jobs/kv_cli.h"
#include "jobs/run/metrics.h"
#include "jobs/dist_cli.h"
#include "jobs/run/progress.h"
#include "jobs/signals.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "memory/kv_dist.h"
#include "policies/policy.h"
#include "base/alloc.h"
#include "base/dtype.h"
#include "base/sys.h"
#include "base/log.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/harmony.h"
#include "runtime/exec/forward.h"
#include "runtime/model/model.h"
#include "runtime/exec/scheduler.h"
#include "runtime/text/tokenizer.h"


void tsr_run_req_clear(tsr_run_req *r) {
    tsr_free(r->custom_id);
    for (int i = 0; i < r->n_stops; i++) tsr_free(r->stops[i]);
    tsr_free(r->text);
    memset(r, 0, sizeof *r);
}

static void tsr__run_free(tsr_run_job *g) {
    tsr_sched_destroy(g->sched);
    tsr_chat_template_free(&g->chat);
    if (g->in) fclose(g->in);
    tsr_batch_writer_close(&g->out);
    tsr_batch_writer_close(&g->err);
    tsr_batch_lock_release(&g->err_lock);
    tsr_batch_lock_release(&g->out_lock);
    tsr_batch_input_index_free(&g->ix);
    tsr_batch_resume_free(&g->resume);
    tsr_strset_destroy(g->seen);
    if (g->reqs)
        for (int i = 0; i < g->n_reqs; i++) tsr_run_req_clear(&g->reqs[i]);
    tsr_free(g->reqs);
    tsr_metrics_free(&g->m);
    if (g->has_pending) tsr_batch_request_free(&g->pending);
    tsr_free(g->ck_lines);
    /* forward, KV cache, placed weights, backend, tokenizer, model, comm */
    tsr_engine_destroy(g->eng);
}

/* One record written: output first (the source of truth), then the errors file. A failed
 * write (the writer has cut the file back to its last whole record) stops the job at the
 * next step (tsr__should_stop); the records finished until then are not written, and a
 * rerun computes them again. */
static tsr_status tsr__put(tsr_run_job *g, char *line, bool is_error) {
    if (!line) return tsr_error_set(TSR_ERR_NOMEM, "cannot format an output record");
    tsr_status st = TSR_OK;
    /* in the output (the other ranks count as rank 0 would, until a failure is agreed) */
    bool in_output = !g->root;
    if (g->root && !g->write_failed) {
        st = tsr_batch_writer_put(&g->out, line);
        in_output = st == TSR_OK;
        if (st == TSR_OK && is_error) st = tsr_batch_writer_put(&g->err, line);
    }
    tsr_free(line);
    if (st == TSR_ERR_IO) {
        g->write_failed = true;
        snprintf(g->write_error, sizeof g->write_error, "%s", tsr_last_error());
        st = TSR_OK;
    }
    TSR_TRY(st);
    if (in_output) g->records_this_run++;
    g->processed++;
    /* Test hook: die like a SIGKILL after N records, to exercise restart. */
    if (g->kill_after > 0 && g->records_this_run >= g->kill_after) _exit(137);
    return TSR_OK;
}

static tsr_status tsr__put_error(tsr_run_job *g, const char *custom_id, int64_t line,
                                 uint64_t line_hash, const char *code, const char *msg) {
    g->m.failed++;
    return tsr__put(g, tsr_batch_format_error_bound(custom_id, line, line_hash, code, msg),
                    true);
}

static const char *tsr__basename(const char *p, char *buf, size_t cap) {
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && p[s - 1] != '/') s--;
    snprintf(buf, cap, "%.*s", (int)(n - s), p + s);
    return buf;
}

static tsr_status tsr__open_output(tsr_run_job *g) {
    const tsr_run_opts *o = g->o;
    struct stat sb;
    if (stat(o->output, &sb) == 0 && S_ISDIR(sb.st_mode))
        return tsr_error_set(TSR_ERR_INVALID, "--output %s is a directory: give a file path",
                             o->output);
    if (stat(g->err_path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return tsr_error_set(TSR_ERR_INVALID, "--errors %s is a directory: give a file path",
                             g->err_path);
    /* Locked before anything is read or written: a second job on the same files stops
     * here with one line naming the holder. */
    TSR_TRY(tsr_batch_lock_take(&g->out_lock, o->output));
    if (strcmp(g->err_path, o->output) != 0)
        TSR_TRY(tsr_batch_lock_take(&g->err_lock, g->err_path));
    /* Read only: the output is changed (a partial last line cut, superseded records removed)
     * by tsr__open_writers, once the job is known to run (a refused checkpoint leaves the
     * output as it was). */
    TSR_TRY(tsr_batch_resume_scan_bound(o->output, &g->ix, false, &g->resume));
    if (g->resume.n_ignored > 0)
        TSR_LOG_WARN("%s: %" PRId64 " complete lines are not batch records (left in place)",
                     o->output, g->resume.n_ignored);
    /* Fails here, before any change, when the output cannot be opened for writing. */
    int fd = open(o->output, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot open for writing: %s", o->output,
                             strerror(errno));
    close(fd);
    return TSR_OK;
}

/* Rank 0, once the job runs: the output's partial last line cut and its superseded records
 * removed, then the writers opened and the errors file rebuilt from the output. */
static tsr_status tsr__open_writers(tsr_run_job *g) {
    const tsr_run_opts *o = g->o;
    /* After the checkpoint's checks, whose refusals are the more specific ones. */
    if (g->resume.n_foreign > 0)
        return tsr_error_set(TSR_ERR_INVALID,
                             "%s holds %" PRId64 " records of requests that %s does not have "
                             "(the first: %.100s): it is another input's output; give another "
                             "--output, or remove those records", o->output,
                             g->resume.n_foreign, o->input, g->resume.first_foreign);
    TSR_TRY(tsr_batch_resume_fix(o->output, &g->ix, &g->resume));
    /* The output first: an unwritable --output is reported as such, before the errors
     * file beside it fails the same way. */
    TSR_TRY(tsr_batch_writer_open(&g->out, o->output));
    TSR_TRY(tsr_batch_rebuild_errors(o->output, g->err_path));
    return tsr_batch_writer_open(&g->err, g->err_path);
}

/* The job's files, once the engine runs: input, output, chat template. */
static tsr_status tsr__setup_files(tsr_run_job *g) {
    const tsr_run_opts *o = g->o;
    g->in = fopen(o->input, "rb");
    if (!g->in)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot open the input: %s", o->input,
                             strerror(errno));
    /* Refuse an input that is not UTF-8 before any output; count the requests (non-blank
     * lines) for progress. */
    long start = 0;
    TSR_TRY(tsr_batch_input_scan(o->input, g->in, &g->m.lines, &start));
    if (fseek(g->in, start, SEEK_SET) != 0)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot seek the input: %s", o->input,
                             strerror(errno));
    /* The input's keys and line hashes, which bind the existing output to this input. */
    TSR_TRY(tsr_batch_input_index_build(o->input, g->in, &g->ix));
    if (fseek(g->in, start, SEEK_SET) != 0)
        return tsr_error_set(TSR_ERR_IO, "%s: cannot seek the input: %s", o->input,
                             strerror(errno));

    if (o->errors) {
        snprintf(g->err_path, sizeof g->err_path, "%s", o->errors);
    } else {
        size_t l = strlen(o->output);
        int stem = l > 6 && !strcmp(o->output + l - 6, ".jsonl") ? (int)(l - 6) : (int)l;
        snprintf(g->err_path, sizeof g->err_path, "%.*s.errors.jsonl", stem, o->output);
    }
    /* Rank 0 scans the output first (it may cut a partial last record), then the other
     * ranks read the same records (input and output on a shared file system). */
    tsr_status st = TSR_OK;
    if (g->root) st = tsr__open_output(g);
    TSR_TRY(tsr_dist_agree(g->dist, st));
    st = g->root ? TSR_OK : tsr_batch_resume_scan_bound(o->output, &g->ix, false, &g->resume);
    TSR_TRY(tsr_dist_agree(g->dist, st));
    TSR_TRY(tsr_strset_create(&g->seen));

    tsr_status cst = tsr_model_chat_template(o->model, &g->chat);
    if (cst == TSR_ERR_UNSUPPORTED) { /* completions still work; chat lines get errors */
        if (!o->quiet) fprintf(stderr, "tessera run: warning: %s\n", tsr_last_error());
        g->chat.kind = TSR_CHAT_NONE;
    } else if (cst != TSR_OK) {
        return cst;
    }
    /* GPT-OSS: the built-in harmony template when the model brings none; chat answers
     * written as their final channel's text (runtime/text/harmony.h) */
    if (g->chat.kind == TSR_CHAT_NONE && g->model->cfg.arch == TSR_ARCH_GPT_OSS)
        TSR_TRY(tsr_harmony_template(&g->chat));
    tsr_harmony_ids hids;
    g->harmony_fmt = tsr_harmony_ids_find(g->tok, &hids);
    g->harmony = !o->harmony_raw && g->harmony_fmt;
    g->harmony_call = g->harmony ? hids.call : -1;
    tsr__basename(o->model, g->model_name, sizeof g->model_name);
    return TSR_OK;
}

/* The line hashes of the requests resumed from a checkpoint (their records are bound to
 * their lines like any other; they may finish before the reader reaches their lines). */
static tsr_status tsr__resumed_hashes(tsr_run_job *g) {
    long pos = ftell(g->in);
    if (pos < 0)
        return tsr_error_set(TSR_ERR_IO, "%s: %s", g->o->input, strerror(errno));
    char *buf = NULL;
    size_t cap = 0;
    int64_t line = 0;
    tsr_status st = TSR_OK;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&buf, &cap, g->in);
        if (n < 0) {
            if (ferror(g->in))
                st = tsr_error_set(TSR_ERR_IO, "%s: read error: %s", g->o->input,
                                   strerror(errno));
            break;
        }
        line++;
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
        for (int i = 0; i < g->n_reqs; i++)
            if (g->reqs[i].used && g->reqs[i].line == line)
                g->reqs[i].line_hash = tsr_batch_line_hash(buf, (size_t)n);
    }
    free(buf); /* getline allocates with malloc */
    clearerr(g->in);
    if (fseek(g->in, pos, SEEK_SET) != 0 && st == TSR_OK)
        st = tsr_error_set(TSR_ERR_IO, "%s: cannot seek the input: %s", g->o->input,
                           strerror(errno));
    return st;
}

/* The engine is the start-up (job, model, tokenizer, shard, placement, backend, data plane,
 * weights, KV cache, forward); then the job's files and the scheduler. Every fallible local
 * step is agreed on before the next collective one. */
static tsr_status tsr__setup(tsr_run_job *g) {
    const tsr_run_opts *o = g->o;
    tsr_engine_spec spec = {.model_path = o->model, .load_tokenizer = true,
                            .tokenizer_path = o->tokenizer, .distributed = true,
                            .dist = o->dist, .backend = o->backend,
                            .threads = o->threads_given ? o->threads : 0,
                            .max_tokens = o->max_batch_tokens, .kv = o->kv.kv,
                            .pack_weights = true, .rank_out = &g->rank};
    /* converted after the shard cut; the checkpoint records the dtype they run in
     * (run_checkpoint.c) */
    tsr_engine_spec_dtype(&spec, o->dtype);
    if (o->checkpoint) { /* the whole model's identity, before the shard cut */
        spec.model_loaded = tsr_run_ckpt_model_loaded;
        spec.model_loaded_ctx = g;
    }
    spec.kv.max_seqs = o->max_batch_seqs;
    spec.kv.chunk_tokens = o->max_batch_tokens;
    /* the pool must hold one sequence of the context (kv_setup.h); 0: the model's */
    spec.kv.max_context = o->max_context;
    g->root = g->rank == 0;
    TSR_TRY(tsr_engine_create(&spec, &g->eng));
    g->dist = &g->eng->dist;
    g->root = tsr_dist_is_root(g->dist);
    g->model = g->eng->model;
    g->tok = g->eng->tok;
    g->ctx = g->eng->ctx;
    g->be = g->eng->be;
    g->kv = g->eng->kv;
    g->fwd = g->eng->fwd;
    tsr_dist *d = g->dist;
    const tsr_model_config *c = &g->model->cfg;
    TSR_TRY(tsr_dist_agree(d, tsr__setup_files(g)));
    tsr_sched_config sc = {.max_seqs = o->max_batch_seqs, .max_tokens = o->max_batch_tokens,
                           .max_context = g->ctx, .vocab_size = c->vocab_size,
                           .preempt = strcmp(o->preempt, "swap") ? TSR_PREEMPT_RECOMPUTE
                                                                 : TSR_PREEMPT_SWAP};
    if (g->tok->eos_id >= 0) sc.eos_ids[sc.n_eos++] = g->tok->eos_id;
    for (int i = 0; i < g->tok->n_eos_ids && i < 8; i++) {
        bool dup = false;
        for (int j = 0; j < sc.n_eos; j++) dup |= sc.eos_ids[j] == g->tok->eos_ids[i];
        if (!dup && sc.n_eos < 9) sc.eos_ids[sc.n_eos++] = g->tok->eos_ids[i];
    }
    TSR_TRY(tsr_sched_create(&sc, g->kv, tsr_sched_exec_forward, g->fwd, &g->sched));
    /* --pp: the last stage samples and sends token ids, not logits, to the others */
    TSR_TRY(tsr_sched_sample_last_stage(g->sched, g->fwd));
    /* Running plus waiting requests never exceed 2 * max_batch_seqs (lazy feeding). */
    g->n_reqs = 2 * o->max_batch_seqs + 1;
    g->reqs = tsr_calloc((size_t)g->n_reqs, sizeof *g->reqs);
    if (!g->reqs) return TSR_ERR_NOMEM;
    if (o->verbose && g->root)
        TSR_LOG_INFO("model %s: dim %d, %d layers, vocab %d, context %d, %s weights%s%s; "
                     "backend %s, %d threads; chat template: %s; output has %" PRId64 " records",
                     o->model, c->dim, c->n_layers, c->vocab_size, g->ctx,
                     tsr_dtype_name(c->dtype), g->eng->model->file_type[0] ? " from a GGUF " : "",
                     g->eng->model->file_type,
                     tsr_engine_device_name(g->eng),
                     g->be->threads,
                     g->chat.kind == TSR_CHAT_NONE ? "none" : "the model's (jinja)",
                     g->resume.n_records);
    if (o->verbose) tsr_dist_log_layout(d);
    return TSR_OK;
}

/* Encodes and submits one parsed request, or writes its error record. `arrival` >= 0: the
 * request's arrival (seconds after t_start), from which its latencies count; < 0
 * (offline): from now. */
static tsr_status tsr__submit(tsr_run_job *g, tsr_batch_request *r, uint64_t hash,
                              double arrival) {
    char *rendered = NULL, forced[256] = "";
    const char *text = r->prompt;
    size_t text_len = text ? strlen(text) : 0;
    bool bos = !g->o->no_bos && g->tok->bos_id >= 0;
    if (r->kind == TSR_BATCH_CHAT) {
        if (g->chat.kind == TSR_CHAT_NONE)
            return tsr__put_error(g, r->custom_id, r->line, hash, TSR_BATCH_E_TEMPLATE,
                                  "model has no chat template tessera can render "
                                  "(use /v1/completions)");
        /* tools, tool messages or tool calls: the whole context (harmony: the developer
         * message's `# Tools`, runtime/text/harmony.h) */
        tsr_chat_opts co = {.add_generation_prompt = true, .now = -1};
        tsr_status cs = r->chat_ctx ? tsr_chat_render_json(&g->chat, r->chat_ctx, &co, &rendered,
                                                           &text_len)
                                    : tsr_chat_render(&g->chat, r->messages, r->n_messages,
                                                      &rendered, &text_len);
        if (cs == TSR_ERR_INVALID) /* the template refused these messages (raise_exception) */
            return tsr__put_error(g, r->custom_id, r->line, hash,
                                  r->chat_ctx ? TSR_BATCH_E_TOOLS_UNSUP : TSR_BATCH_E_TEMPLATE,
                                  tsr_last_error());
        TSR_TRY(cs);
        text = rendered;
        bos = false; /* the template starts with bos_token */
        if (r->force_call) {
            /* tool_choice "required" or a named function: the answer's header is written
             * here (harmony.h tsr_harmony_force_call); other formats have no header to
             * write, so nothing would force the call */
            static const char gen[] = "<|start|>assistant";
            const size_t gl = sizeof gen - 1;
            if (!g->harmony_fmt || text_len < gl || memcmp(text + text_len - gl, gen, gl)) {
                tsr_free(rendered);
                return tsr__put_error(g, r->custom_id, r->line, hash, TSR_BATCH_E_TOOLS_UNSUP,
                                      "tool_choice \"required\" or a named function is forced on "
                                      "harmony models (GPT-OSS) only");
            }
            if ((r->force_name && strlen(r->force_name) > 200) ||
                !tsr_harmony_force_call(r->force_name, forced, sizeof forced)) {
                tsr_free(rendered);
                return tsr__put_error(g, r->custom_id, r->line, hash, TSR_BATCH_E_TOOLS,
                                      "tool_choice names a function longer than 200 bytes");
            }
            size_t fl = strlen(forced);
            char *t = tsr_realloc(rendered, text_len + fl + 1);
            if (!t) {
                tsr_free(rendered);
                return TSR_ERR_NOMEM;
            }
            memcpy(t + text_len, forced, fl + 1);
            text = rendered = t;
            text_len += fl;
        }
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tsr_status st = tsr_tokenizer_encode(g->tok, text, text_len, bos, false, &ids, &n_ids);
    tsr_free(rendered);
    if (st == TSR_ERR_NOMEM) return st;
    if (st != TSR_OK) {
        tsr_free(ids);
        return tsr__put_error(g, r->custom_id, r->line, hash, TSR_BATCH_E_PROMPT, tsr_last_error());
    }
    if (n_ids == 0) {
        tsr_free(ids);
        return tsr__put_error(g, r->custom_id, r->line, hash, TSR_BATCH_E_PROMPT,
                              "prompt encodes to no tokens");
    }
    if ((int64_t)n_ids >= g->ctx) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "prompt of %zu tokens does not fit the context of %d tokens (leaves no room "
                 "to generate)",
                 n_ids, g->ctx);
        tsr_free(ids);
        return tsr__put_error(g, r->custom_id, r->line, hash, TSR_BATCH_E_TOO_LONG, msg);
    }
    int slot = 0;
    while (slot < g->n_reqs && g->reqs[slot].used) slot++;
    TSR_ASSERT(slot < g->n_reqs);
    tsr_sched_request sr = {.tag = (uint64_t)slot, .prompt = ids, .n_prompt = (int32_t)n_ids,
                            .max_new_tokens = r->max_tokens,
                            .sampling = {.temperature = r->temperature, .top_p = r->top_p,
                                         .top_k = 0,
                                         .seed = r->has_seed ? r->seed : g->o->seed}};
    int32_t last = ids[n_ids - 1];
    st = tsr_sched_submit(g->sched, &sr);
    tsr_free(ids);
    if (st == TSR_ERR_NOMEM) return st;
    if (st != TSR_OK)
        return tsr__put_error(g, r->custom_id, r->line, hash, TSR_BATCH_E_PARAM, tsr_last_error());
    tsr_run_req *q = &g->reqs[slot];
    q->used = true;
    q->body_hash = tsr_run_req_body_hash(r); /* before its strings move */
    q->line_hash = hash;
    q->custom_id = r->custom_id; /* ownership moves */
    r->custom_id = NULL;
    q->line = r->line;
    q->kind = r->kind;
    for (int i = 0; i < r->n_stops; i++) q->stops[i] = r->stops[i];
    q->n_stops = r->n_stops;
    r->n_stops = 0;
    q->prev = last; /* SentencePiece's leading-space rule looks at it, as in generate */
    q->n_prompt = (int)n_ids;
    /* a forced call's header begins the answer's text, as if the model had written it: the
     * record's parse (tsr__finish) then reads the call */
    size_t fl = strlen(forced);
    if (fl) {
        q->text = tsr_malloc(fl + 1);
        if (!q->text) return TSR_ERR_NOMEM;
        memcpy(q->text, forced, fl + 1);
        q->len = fl;
        q->cap = fl + 1;
    }
    q->t_submit = arrival >= 0 ? g->t_start + arrival : tsr_sys_now();
    g->m.prompt_tokens += (int64_t)n_ids;
    return TSR_OK;
}

/* --arrival-rate: the gap to the next arrival of a Poisson process of rate R, -ln(1-U)/R
 * with U uniform in [0, 1) from a splitmix64 stream seeded by --seed (the same on every
 * rank, so the ranks agree on the arrivals). */
static double tsr__arrival_gap(tsr_run_job *g) {
    uint64_t z = (g->arrival_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double u = (double)(z >> 11) * 0x1.0p-53;
    return -log1p(-u) / (double)g->o->arrival_rate;
}

/* The job's clock (seconds since t_start), agreed over the ranks (their least), so that
 * every rank admits the same requests at the same step. */
static double tsr__clock(tsr_run_job *g) {
    double t = tsr_sys_now() - g->t_start;
    if (g->dist->world <= 1) return t;
    int64_t us = (int64_t)(t * 1e6);
    if (tsr_comm_allreduce_i64(g->dist->comm, TSR_COMM_WORLD, &us, 1, TSR_COMM_MIN) != TSR_OK)
        tsr_comm_abort(g->dist->comm, 1, tsr_last_error());
    return (double)us * 1e-6;
}

/* Reads and handles input lines until the waiting queue holds max_batch_seqs requests or
 * the input ends. With --arrival-rate a valid request is submitted only once the clock has
 * reached its arrival; one read early waits in g->pending (bad lines get their error
 * records when read: they never reach the engine). */
static tsr_status tsr__feed(tsr_run_job *g, int64_t *line_no, bool *eof) {
    char *buf = NULL;
    size_t cap = 0;
    tsr_status st = TSR_OK;
    bool arrivals = g->o->arrival_rate > 0;
    double clock = arrivals ? tsr__clock(g) : 0.0;
    if (g->has_pending) {
        if (clock < g->pending_arrival ||
            tsr_sched_n_waiting(g->sched) >= g->o->max_batch_seqs)
            return TSR_OK;
        g->has_pending = false;
        st = tsr__submit(g, &g->pending, g->pending_hash, g->pending_arrival);
        tsr_batch_request_free(&g->pending);
        TSR_TRY(st);
    }
    while (!*eof && tsr_sched_n_waiting(g->sched) < g->o->max_batch_seqs) {
        errno = 0;
        ssize_t n = getline(&buf, &cap, g->in);
        if (n < 0) {
            if (ferror(g->in))
                st = tsr_error_set(TSR_ERR_IO, "%s: read error: %s", g->o->input,
                                   strerror(errno));
            *eof = true;
            break;
        }
        (*line_no)++;
        bool blank;
        uint64_t hash = 0;
        tsr_batch_request r;
        tsr_batch_error e;
        tsr_status pst;
        st = tsr_batch_take_line(buf, (size_t)n, *line_no, g->seen, &blank, &hash, &r, &e, &pst);
        if (st != TSR_OK || blank) {
            tsr_batch_request_free(&r);
            if (st != TSR_OK) break;
            continue; /* blank lines are not requests */
        }
        if (tsr_batch_resume_has(&g->resume, r.custom_id, *line_no)) {
            g->m.skipped++;
        } else if (tsr_run_ckpt_resumed(g, *line_no)) {
            /* restored from the checkpoint: already in the scheduler; its record is bound
             * to this line */
            for (int i = 0; i < g->n_reqs; i++)
                if (g->reqs[i].used && g->reqs[i].line == *line_no) g->reqs[i].line_hash = hash;
        } else if (pst != TSR_OK) {
            st = tsr__put_error(g, r.custom_id, *line_no, hash, e.code, e.message);
        } else if (arrivals) {
            double at = g->next_arrival;
            g->next_arrival += tsr__arrival_gap(g);
            if (clock < at) { /* not yet: it waits, and the reading stops */
                g->pending = r;
                g->pending_arrival = at;
                g->pending_hash = hash;
                g->has_pending = true;
                break;
            }
            st = tsr__submit(g, &r, hash, at);
        } else {
            st = tsr__submit(g, &r, hash, -1.0);
        }
        tsr_batch_request_free(&r);
        if (st != TSR_OK) break;
    }
    free(buf);
    return st;
}

/* Appends `piece` and reports whether a stop string now occurs (text trimmed there). With
 * `harmony` (a chat answer in harmony) the stop strings match the final channel's text only,
 * the completion the record holds: a match starts inside the open final message. */
static tsr_status tsr__append(tsr_run_req *q, const char *piece, size_t n, bool harmony,
                              bool *stopped) {
    *stopped = false;
    if (q->len + n + 1 > q->cap) {
        size_t cap = q->cap ? q->cap : 256;
        while (cap < q->len + n + 1) cap *= 2;
        char *t = tsr_realloc(q->text, cap);
        if (!t) return TSR_ERR_NOMEM;
        q->text = t;
        q->cap = cap;
    }
    size_t old = q->len;
    memcpy(q->text + q->len, piece, n);
    q->len += n;
    q->text[q->len] = '\0';
    size_t first = 0; /* where a match may start */
    if (harmony && q->n_stops > 0) {
        /* A mark completed by this piece ends in it with its '>': parse the answer again
         * then (a few times an answer); otherwise the last parse holds. */
        if (!q->final_known || memchr(piece, '>', n)) {
            tsr_harmony_answer a;
            tsr_harmony_answer_parse(q->text, q->len, false, &a);
            q->final_open = a.has_final && a.final.begin + a.final.len == q->len;
            q->final_from = a.final.begin;
            q->final_known = true;
        }
        if (!q->final_open) return TSR_OK;
        first = q->final_from;
    }
    size_t best = SIZE_MAX;
    for (int i = 0; i < q->n_stops; i++) {
        size_t L = strlen(q->stops[i]);
        if (L > q->len) continue;
        /* A new match must end inside the new piece. */
        size_t from = old + 1 > L ? old + 1 - L : 0;
        if (from < first) from = first;
        for (size_t at = from; at + L <= q->len && at < best; at++)
            if (!memcmp(q->text + at, q->stops[i], L)) {
                best = at;
                break;
            }
    }
    if (best != SIZE_MAX) {
        q->len = best;
        q->text[best] = '\0';
        *stopped = true;
    }
    return TSR_OK;
}

static tsr_status tsr__finish(tsr_run_job *g, int tag, const char *reason, double now) {
    tsr_run_req *q = &g->reqs[tag];
    const char *raw = q->text ? q->text : "";
    tsr_batch_result res = {.custom_id = q->custom_id, .kind = q->kind,
                            .model = g->model_name, .text = raw, .text_len = q->len,
                            .finish_reason = reason, .prompt_tokens = q->n_prompt,
                            .completion_tokens = q->n_gen, .line_hash = q->line_hash};
    char *reasoning = NULL;
    /* an answer whose header the prompt forced to a function (it begins " to=functions.")
     * is a call even when cut by max_tokens: its arguments so far, finish_reason "length" */
    bool forced = q->len >= 14 && !memcmp(raw, " to=functions.", 14);
    if (g->harmony && q->kind == TSR_BATCH_CHAT) /* the final channel ("" if none) and more */
        TSR_TRY(tsr_batch_result_harmony(&res, raw, q->len, q->called || forced, &reasoning));
    g->m.ok++;
    if (!strcmp(res.finish_reason, "tool_calls"))
        g->m.finish_tool_calls++;
    else if (!strcmp(reason, "stop"))
        g->m.finish_stop++;
    else
        g->m.finish_length++;
    g->m.completion_tokens += q->n_gen;
    if (q->t_first > 0) TSR_TRY(tsr_samples_add(&g->m.ttft, q->t_first - q->t_submit));
    if (q->n_gen > 1)
        TSR_TRY(tsr_samples_add(&g->m.tpot, (now - q->t_first) / (double)(q->n_gen - 1)));
    TSR_TRY(tsr_samples_add(&g->m.e2e, now - q->t_submit));
    tsr_status st = tsr__put(g, tsr_batch_format_result(&res), false);
    tsr_free(reasoning);
    tsr_run_req_clear(q);
    return st;
}

static tsr_status tsr__events(tsr_run_job *g, const tsr_sched_event *ev, int n_ev) {
    double now = tsr_sys_now();
    char piece[512];
    for (int i = 0; i < n_ev; i++) {
        int tag = (int)ev[i].tag;
        tsr_run_req *q = &g->reqs[tag];
        TSR_ASSERT(tag < g->n_reqs && q->used);
        if (q->t_first == 0) q->t_first = now;
        bool stopped = false;
        if (ev[i].token >= 0) {
            /* inter-token latency: the gap since the request's previous output token */
            if (q->t_last > 0) TSR_TRY(tsr_samples_add(&g->m.itl, now - q->t_last));
            q->t_last = now;
            int nb = tsr_tokenizer_decode(g->tok, q->prev, ev[i].token, piece,
                                          sizeof piece);
            q->prev = ev[i].token;
            q->n_gen++;
            if (nb > 0)
                TSR_TRY(tsr__append(q, piece, (size_t)nb, g->harmony && q->kind == TSR_BATCH_CHAT,
                                    &stopped));
        }
        if (stopped) {
            if (ev[i].finish == TSR_FINISH_NONE) tsr_sched_finish(g->sched, ev[i].tag);
            TSR_TRY(tsr__finish(g, tag, "stop", now));
            continue;
        }
        switch (ev[i].finish) {
        case TSR_FINISH_NONE: break;
        case TSR_FINISH_EOS:
            q->called = g->harmony && ev[i].eos == g->harmony_call;
            TSR_TRY(tsr__finish(g, tag, "stop", now));
            break;
        case TSR_FINISH_LENGTH:
        case TSR_FINISH_CONTEXT: TSR_TRY(tsr__finish(g, tag, "length", now)); break;
        case TSR_FINISH_ERROR: {
            tsr_status st = tsr__put_error(g, q->custom_id, q->line, q->line_hash,
                                           TSR_BATCH_E_TOO_LONG,
                                           "request does not fit the KV cache");
            tsr_run_req_clear(q);
            TSR_TRY(st);
            break;
        }
        }
    }
    return TSR_OK;
}

#define TSR__WRITE_FAILED 1000

/* The one place that decides to stop between steps (SIGTERM/SIGINT/SIGUSR1, jobs/signals.h).
 * Multi-rank runs must make this decision collective: all ranks stop at the same step. */
static bool tsr__should_stop(tsr_run_job *g) {
    int signo = 0;
    int64_t sig = tsr_signals_stop_requested(&signo) ? signo : 0;
    /* A failed write on rank 0 stops every rank like a signal (above every signal number) */
    if (g->write_failed) sig = TSR__WRITE_FAILED;
    /* Collective: the ranks see a signal at different steps; the first one stops them all. */
    if (g->dist->world > 1 &&
        tsr_comm_allreduce_i64(g->dist->comm, TSR_COMM_WORLD, &sig, 1, TSR_COMM_MAX) != TSR_OK)
        tsr_comm_abort(g->dist->comm, 1, tsr_last_error());
    if (!sig) return false;
    if (sig == TSR__WRITE_FAILED) {
        g->write_failed = true;
        return true;
    }
    g->stop_signo = (int)sig;
    return true;
}

static tsr_status tsr__job(tsr_run_job *g) {
    const tsr_run_opts *o = g->o;
    double t_setup = tsr_sys_now();
    const char *kill = getenv("TSR_TEST_KILL_AFTER");
    g->kill_after = kill ? strtoll(kill, NULL, 10) : 0;
    TSR_TRY(tsr__setup(g));
    int64_t todo = g->m.lines - g->resume.n_records;
    if (todo < 0) todo = 0;
    g->t_start = tsr_sys_now();
    g->arrival_rng = o->seed ^ 0x6172726976616C73ull; /* its own stream, not the samplers' */
    g->next_arrival = 0.0;
    g->m.setup_s = g->t_start - t_setup;
    bool quiet = o->quiet || !g->root;
    tsr_progress_init(&g->prog, stderr, "tessera run", todo, o->progress_interval, quiet,
                      g->t_start);
    if (!quiet && g->resume.n_superseded > 0)
        fprintf(stderr,
                "tessera run: %" PRId64 " records superseded: their input lines changed since "
                "they were written; removed from %s, computed again\n",
                g->resume.n_superseded, o->output);
    if (!quiet && g->resume.n_records > 0)
        fprintf(stderr,
                "tessera run: resuming: %s holds %" PRId64 " records%s; %" PRId64
                " requests left\n",
                o->output, g->resume.n_records,
                g->resume.truncated_bytes ? " (a partial last record was removed)" : "", todo);
    int n_resumed = 0;
    if (o->checkpoint) TSR_TRY(tsr_run_ckpt_start(g, &n_resumed));
    if (n_resumed > 0) TSR_TRY(tsr_dist_agree(g->dist, tsr__resumed_hashes(g)));
    TSR_TRY(tsr_dist_agree(g->dist, g->root ? tsr__open_writers(g) : TSR_OK));
    if (!quiet && n_resumed > 0)
        fprintf(stderr, "tessera run: resuming %d in-flight requests from %s\n", n_resumed,
                g->ck_path);

    int64_t line_no = 0;
    bool eof = false;
    for (;;) {
        TSR_TRY(tsr__feed(g, &line_no, &eof));
        if (!tsr_sched_has_work(g->sched)) {
            if (eof && !g->has_pending) break;
            if (g->has_pending) { /* idle until the next arrival (a signal cuts it short) */
                if (tsr__should_stop(g)) break;
                double wait = g->t_start + g->pending_arrival - tsr_sys_now();
                if (wait > 0.1) wait = 0.1;
                if (wait > 0) {
                    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(wait * 1e9)};
                    nanosleep(&ts, NULL);
                }
            }
            continue;
        }
        const tsr_sched_event *ev;
        int n_ev;
        /* Requests still running are dropped: their records are not written, so a rerun
         * runs them again (every written record is already flushed and fsynced). */
        if (tsr__should_stop(g)) break;
        TSR_TRY(tsr_dist_must(g->dist, tsr_sched_step(g->sched, &ev, &n_ev, NULL)));
        TSR_TRY(tsr__events(g, ev, n_ev));
        int64_t dev = tsr_engine_device_bytes(g->eng);
        if (dev > g->m.peak_device_bytes) g->m.peak_device_bytes = dev;
        int64_t toks = g->m.completion_tokens;
        for (int i = 0; i < g->n_reqs; i++) toks += g->reqs[i].n_gen;
        tsr_progress_update(&g->prog, tsr_sys_now(), g->processed, toks);
    }
    int n_saved = -1;
    if (g->write_failed) {
        /* The output is cut back to its last whole record (tsr_batch_writer_put); the
         * requests in flight go to the checkpoint, whose own file system may have room. */
        char ck[4400] = "";
        /* the records in the output are rank 0's count (the others counted every one) */
        if (g->dist->world > 1 &&
            tsr_comm_allreduce_i64(g->dist->comm, TSR_COMM_WORLD, &g->records_this_run, 1,
                                   TSR_COMM_MIN) != TSR_OK)
            tsr_comm_abort(g->dist->comm, 1, tsr_last_error());
        if (o->checkpoint) {
            int n = 0;
            if (tsr_dist_agree(g->dist, tsr_run_ckpt_save(g, &n)) == TSR_OK)
                snprintf(ck, sizeof ck, "; checkpoint: %d in-flight requests saved to %s%s", n,
                         o->checkpoint, g->dist->world > 1 ? " (one file per rank)" : "");
            else
                snprintf(ck, sizeof ck, "; the checkpoint could not be written either: %.300s",
                         tsr_last_error());
        }
        if (!g->root) return tsr_error_set(TSR_ERR_IO, "rank 0 could not write the output");
        return tsr_error_set(TSR_ERR_IO,
                             "%.1000s; kept %" PRId64 " whole records in %s (%" PRId64
                             " bytes, no partial line)%s; make room and rerun the same command "
                             "to resume", g->write_error,
                             g->resume.n_records + g->out.n_put, o->output, g->out.good, ck);
    }
    if (o->checkpoint && g->stop_signo) {
        int n = 0;
        TSR_TRY(tsr_dist_agree(g->dist, tsr_run_ckpt_save(g, &n)));
        n_saved = n;
    } else if (o->checkpoint && remove(g->ck_path) != 0 && errno != ENOENT) {
        TSR_LOG_WARN("%s: cannot remove the checkpoint: %s", g->ck_path, strerror(errno));
    }
    double t_end = tsr_sys_now();
    tsr_progress_finish(&g->prog, t_end, g->processed, g->m.completion_tokens);

    tsr_metrics *m = &g->m;
    m->wall_s = t_end - g->t_start;
    m->model = o->model;
    m->input = o->input;
    m->output = o->output;
    m->backend = g->be->ops->name;
    m->threads = g->be->threads;
    m->max_batch_seqs = o->max_batch_seqs;
    m->max_batch_tokens = o->max_batch_tokens;
    m->max_context = g->ctx;
    tsr_sched_totals t;
    tsr_sched_get_totals(g->sched, &t);
    m->steps = t.steps;
    m->batch_tokens = t.batch_tokens;
    m->prefill_tokens = t.prefill_tokens;
    m->decode_tokens = t.decode_tokens;
    m->preemptions = t.preemptions;
    m->max_running = t.max_running;
    m->preempt = o->preempt;
    m->swaps_out = t.swaps_out;
    m->swaps_in = t.swaps_in;
    m->swap_out_bytes = t.swap_out_bytes;
    m->swap_in_bytes = t.swap_in_bytes;
    m->swap_fallbacks = t.swap_fallbacks;
    m->peak_host_rss_bytes = tsr_sys_peak_rss();
    int64_t dev = tsr_engine_device_bytes(g->eng); /* runtime/engine/engine.h says what it counts */
    if (dev > m->peak_device_bytes) m->peak_device_bytes = dev;
    m->arrival_rate = o->arrival_rate;
    char kv_json[2048];
    tsr_kv_stats_json(g->kv, kv_json, sizeof kv_json);
    m->kv_json = kv_json;
    tsr_kv_options kvo = o->kv.kv;
    kvo.be = g->be;
    tsr_kv_layer_bytes lb;
    TSR_TRY(tsr_kv_layer_bytes_of(&kvo, &g->model->cfg, &lb));
    char kvm[256], kvl[256];
    tsr_kv_layer_bytes_json(&lb, kvm, sizeof kvm);
    m->kv_memory_json = kvm;
    if (!g->root) return TSR_OK;
    if (o->metrics) TSR_TRY(tsr_metrics_write(m, o->metrics));
    if (o->kv.stats) fprintf(stderr, "%s\n{\"kv_memory\":%s}\n", kv_json, kvm);
    if (g->stop_signo) {
        int64_t done = g->resume.n_records + g->processed;
        fprintf(stderr,
                "tessera run: stopped by %s after %" PRId64 " of %" PRId64
                " requests; rerun the same command to resume\n",
                tsr_signals_name(g->stop_signo), done < m->lines ? done : m->lines, m->lines);
        if (n_saved >= 0)
            fprintf(stderr, "tessera run: checkpoint: %d in-flight requests saved to %s%s\n",
                    n_saved, o->checkpoint, "");
    } else if (!o->quiet)
        fprintf(stderr,
                "tessera run: %" PRId64 " requests: %" PRId64 " ok, %" PRId64 " failed, %" PRId64
                " skipped (already in the output) in %.2f s; %" PRId64 " prompt + %" PRId64
                " completion tokens (%.0f tok/s out); records in %s, errors also in %s\n",
                m->lines, m->ok, m->failed, m->skipped, m->wall_s, m->prompt_tokens,
                m->completion_tokens,
                m->wall_s > 0 ? (double)m->completion_tokens / m->wall_s : 0.0, o->output,
                g->err_path);
    if (!o->quiet && !g->stop_signo && m->preemptions > 0)
        fprintf(stderr, "tessera run: %" PRId64 " preemptions (--preempt %s): %" PRId64
                " swapped out, %" PRId64 " in (%.1f MiB out), %" PRId64 " recomputed for a "
                "full host pool\n", m->preemptions, o->preempt, m->swaps_out, m->swaps_in,
                (double)m->swap_out_bytes / 1048576.0, m->swap_fallbacks);
    if (!o->quiet && lb.sliding_layers > 0 && tsr_kv_layer_bytes_line(&lb, kvl, sizeof kvl) > 0)
        fprintf(stderr, "tessera run: %s\n", kvl);
    return TSR_OK;
}

int tsr_cmd_run(int argc, char **argv) {
    tsr_run_opts o = {.max_batch_seqs = 16, .max_batch_tokens = 512, .max_context = 0,
                       .threads = tsr_sys_cpus(), .progress_interval = 10.0f,
                       .seed = 42, .backend = "auto", .preempt = "swap"};
    tsr_kv_cli_init(&o.kv);
    tsr_dist_cli_init(&o.dist);
    tsr_cli_opt base[] = {
        {"model", TSR_OPT_STRING, &o.model, "PATH",
         "model: llama2.c .bin, GGUF file, Hugging Face directory, or synthetic:NAME "
         "(required)", false},
        {"tokenizer", TSR_OPT_STRING, &o.tokenizer, "PATH",
         "tokenizer.bin or tokenizer.json (default: found next to the model)", false},
        {"input", TSR_OPT_STRING, &o.input, "IN.jsonl",
         "OpenAI batch requests, one UTF-8 JSON object a line (required); a line that is not "
         "UTF-8 gets an invalid_encoding error record, a UTF-16/32 file is refused", false},
        {"output", TSR_OPT_STRING, &o.output, "OUT.jsonl",
         "records are appended here, each bound to its input line (line_hash); locked for the "
         "job's life (OUT.lock); a rerun skips the lines answered unchanged, recomputes edited "
         "ones and refuses another input's output (required)", false},
        {"errors", TSR_OPT_STRING, &o.errors, "ERR.jsonl",
         "copy of the error records (default: OUT with .jsonl -> .errors.jsonl)", false},
        {"max-batch-seqs", TSR_OPT_INT, &o.max_batch_seqs, "N",
         "sequences decoded together at most", false},
        {"max-batch-tokens", TSR_OPT_INT, &o.max_batch_tokens, "N",
         "tokens per forward step at most (prefill chunks + decodes); >= max-batch-seqs",
         false},
        {"max-context", TSR_OPT_INT, &o.max_context, "N",
         "context length in tokens, prompt included (0 = the model's maximum)", false},
        {"threads", TSR_OPT_INT, &o.threads, "N",
         "CPU threads per rank (default: the CPUs given to the job over its ranks on the node; "
         "at most 4 per CPU this process may run on)",
         false},
        {"backend", TSR_OPT_STRING, &o.backend, "NAME", tsr_backend_names(), false},
        {"dtype", TSR_OPT_STRING, &o.dtype, TSR_CLI_DTYPE_VALUES, TSR_CLI_DTYPE_HELP, false},
        {"seed", TSR_OPT_U64, &o.seed, "S",
         "seed of requests whose body has no \"seed\", and of the --arrival-rate arrivals",
         false},
        {"arrival-rate", TSR_OPT_FLOAT, &o.arrival_rate, "R",
         "requests arrive by a Poisson process of R requests/s (the first at the start), "
         "each admitted once the job's clock reaches its arrival; latencies count from the "
         "arrival (0 = offline: all at once)", false},
        {"metrics", TSR_OPT_STRING, &o.metrics, "FILE.json",
         "write totals, latency percentiles, throughput, memory and KV stats here", false},
        {"progress-interval", TSR_OPT_FLOAT, &o.progress_interval, "S",
         "seconds between progress lines when stderr is not a terminal (0 = final only)",
         false},
        {"no-bos", TSR_OPT_FLAG, &o.no_bos, NULL, "do not prepend BOS to completion prompts",
         false},
        {"harmony-raw", TSR_OPT_FLAG, &o.harmony_raw, NULL,
         "chat requests on a harmony model (GPT-OSS): write the whole answer, every channel "
         "with its special tokens (default: the final channel's text; stop strings match "
         "the whole answer either way)", false},
        {"quiet", TSR_OPT_FLAG, &o.quiet, NULL, "no progress or summary on stderr", false},
        {"verbose", TSR_OPT_FLAG, &o.verbose, NULL, "log model and backend details", false},
        {"preempt", TSR_OPT_STRING, &o.preempt, "MODE",
         "how a sequence gives up its KV when memory is short: swap (to the host pool, back "
         "intact; recompute when the host pool is full) or recompute (prefill it again)",
         false},
        {"checkpoint", TSR_OPT_STRING, &o.checkpoint, "FILE.h5",
         "on a stop signal save the in-flight requests and their KV here (one HDF5 file, all "
         "ranks); a rerun resumes them where they stopped, on any layout; one written by another job "
         "(model, tokenizer, input lines, options) or damaged is refused; needs the HDF5 "
         "module libtessera-hdf5.so installed with the binary (checked at start-up)", false},
        {"checkpoint-discard", TSR_OPT_FLAG, &o.checkpoint_discard, NULL,
         "a --checkpoint file that does not fit this job or is damaged is removed and its "
         "requests are recomputed, instead of refused", false},
    };
    enum { N_BASE = sizeof base / sizeof base[0] };
    tsr_cli_opt opts[N_BASE + TSR_KV_CLI_N_OPTS + TSR_DIST_CLI_N_OPTS];
    memcpy(opts, base, sizeof base);
    int n_kv = tsr_kv_cli_opts(&o.kv, opts + N_BASE); /* one per policy option */
    tsr_dist_cli_opts(&o.dist, opts + N_BASE + n_kv);
    tsr_cli cli = {.cmd = "run",
                   .synopsis = "--model PATH --input IN.jsonl --output OUT.jsonl [options]",
                   .about = "Bulk generation: OpenAI batch lines (/v1/completions, "
                            "/v1/chat/completions) in, one record per line out,\n"
                            "in completion order. Bad lines (invalid JSON, not UTF-8, ...) become "
                            "error records and\nthe job goes on; exit status 0 when the job "
                            "ran, 1 on fatal errors (input, model, output;\na write error cuts "
                            "the output back to its last whole record and writes --checkpoint),"
                            "\n2 on usage errors, 3 when stopped by "
                            "SIGTERM, SIGINT or SIGUSR1 before the end (finished records are "
                            "kept;\nrerun the same command to resume).",
                   .opts = opts,
                   .n_opts = N_BASE + n_kv + TSR_DIST_CLI_N_OPTS};
    tsr_cli_result r = tsr_cli_parse(&cli, argc, argv);
    if (r == TSR_CLI_HELP) return 0;
    if (r != TSR_CLI_OK) return 2;
    if (!o.model) return tsr_cli_usage_error(&cli, "--model is required");
    o.kv.quiet = o.quiet;
    if (tsr_kv_cli_check(&cli, &o.kv) != TSR_CLI_OK) return 2;
    if (tsr_dist_cli_check(&cli, &o.dist) != TSR_CLI_OK) return 2;
    o.threads_given = tsr_cli_find(&cli, "threads")->seen;
    if (!o.input) return tsr_cli_usage_error(&cli, "--input is required");
    if (!o.output) return tsr_cli_usage_error(&cli, "--output is required");
    if (o.max_batch_seqs < 1) return tsr_cli_usage_error(&cli, "--max-batch-seqs must be >= 1");
    if (o.max_batch_tokens < o.max_batch_seqs)
        return tsr_cli_usage_error(&cli, "--max-batch-tokens must be >= --max-batch-seqs");
    if (o.max_context < 0) return tsr_cli_usage_error(&cli, "--max-context must be >= 0");
    if (strcmp(o.preempt, "swap") && strcmp(o.preempt, "recompute"))
        return tsr_cli_usage_error(&cli, "--preempt must be swap or recompute");
    if (tsr_cli_check_threads(&cli, o.threads) != TSR_CLI_OK) return 2;
    if (tsr_cli_check_dtype(&cli, o.dtype) != TSR_CLI_OK) return 2;
    if (!(o.arrival_rate >= 0 && o.arrival_rate < 1e9))
        return tsr_cli_usage_error(&cli, "--arrival-rate must be >= 0 (requests/s)");
    if (o.progress_interval < 0)
        return tsr_cli_usage_error(&cli, "--progress-interval must be >= 0");
    if (!strcmp(o.input, o.output))
        return tsr_cli_usage_error(&cli, "--input and --output must differ");
    if (o.checkpoint_discard && !o.checkpoint)
        return tsr_cli_usage_error(&cli, "--checkpoint-discard needs --checkpoint");
    if (o.checkpoint && !tsr_ckpt_available())
        return tsr_cli_usage_error(&cli, "--checkpoint: %s", tsr_last_error());
    if (o.checkpoint && !o.kv.kv.policy->checkpointable)
        return tsr_cli_usage_error(&cli, "--checkpoint does not support --kv-policy %s (it "
                                   "keeps KV of its own that a checkpoint does not save)",
                                   o.kv.kv.policy->name);
    if (o.verbose) tsr_log_set_level(TSR_LOG_INFO);

    tsr_run_job g = {.o = &o};
    tsr_status st = tsr_signals_install();
    if (st == TSR_OK) st = tsr__job(&g);
    int rc = st != TSR_OK ? tsr_dist_fail(g.rank, "run") : g.stop_signo ? TSR_EXIT_STOPPED : 0;
    tsr__run_free(&g);
    tsr_signals_restore();
    return rc;
}
