#define _GNU_SOURCE /* wait4 */
#include "jobs/study/cell_runner.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/file.h"
#include "base/sys.h"
#include "runtime/text/tokenizer.h"

tsr_status tsr_cell_self_exe(char *buf, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1)
        return tsr_error_set(TSR_ERR_IO, "characterize: cannot resolve /proc/self/exe: %s",
                             n < 0 ? strerror(errno) : "path too long");
    buf[n] = '\0';
    return TSR_OK;
}

static void tsr__sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Whether a message says memory ran out (ours, libc's, the OpenBLAS probe's, MPI's,
 * Slurm's). */
static bool tsr__says_oom(const char *s) {
    static const char *const pats[] = {"out of memory", "Out of memory", "Out Of Memory",
                                       "cannot allocate", "Cannot allocate", "ENOMEM",
                                       "score matrix", "address-space limit", "bad_alloc",
                                       "memory exhausted", "needs more memory",
                                       "not enough memory", "oom-kill"};
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++)
        if (strstr(s, pats[i])) return true;
    return false;
}

/* A line of tessera's own that says why it stopped: "tessera: ...", "tessera: rank N: ...",
 * "tessera error: ...", "tessera[rank N] error: ..."; not its warnings, info or debug lines
 * (a rank's warning must not stand for the failure). */
/* Copies a line into a fixed buffer, cut at its size (a copy, not a format: lines longer
 * than the buffer are expected and cut on purpose). */
static void tsr__set_line(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static bool tsr__own_line(const char *l) {
    if (strncmp(l, "tessera", 7) != 0) return false;
    const char *colon = strchr(l, ':');
    if (!colon) return false;
    static const char *const quiet[] = {" warning:", " info:", " debug:"};
    for (size_t i = 0; i < sizeof quiet / sizeof *quiet; i++) {
        const char *w = strstr(l, quiet[i]);
        if (w && w + strlen(quiet[i]) - 1 == colon) return false;
    }
    return true;
}

/* What a launcher says of a rank that a signal ended: Open MPI's "... exited on signal 9
 * (Killed)", Slurm's "srun: error: NODE: task 0: Killed". 0 when the line says neither. */
static int tsr__rank_signal(const char *l) {
    const char *m = strstr(l, "exited on signal ");
    int sig = 0;
    if (m && sscanf(m, "exited on signal %d", &sig) == 1 && sig > 0) return sig;
    if (strstr(l, "srun: error:") && strstr(l, ": task ")) {
        size_t n = strlen(l);
        if (n >= 8 && strcmp(l + n - 8, ": Killed") == 0) return SIGKILL;
    }
    return 0;
}

void tsr_cell_read_stderr(const char *stderr_path, tsr_cell_proc *p) {
    p->last_line[0] = p->own_line[0] = '\0';
    p->rank_signal = 0;
    FILE *f = fopen(stderr_path, "rb");
    if (!f) return;
    /* the tail: the launcher's help text is a few KiB at most */
    static char buf[16384];
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    long start = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    size_t n = 0;
    if (size >= 0 && fseek(f, start, SEEK_SET) == 0) n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char own_oom[sizeof p->own_line] = "", head[sizeof p->last_line] = "";
    bool in_help = false;
    char *line = buf;
    if (start > 0) { /* the first line is cut: skip it */
        char *nl = strchr(buf, '\n');
        line = nl ? nl + 1 : buf + n;
    }
    while (*line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        /* a progress bar redrawn with \r: its last state */
        char *l = strrchr(line, '\r');
        l = l ? l + 1 : line;
        size_t len = strlen(l);
        while (len > 0 && (l[len - 1] == ' ' || l[len - 1] == '\t')) l[--len] = '\0';
        bool rule = len > 0 && strspn(l, "-") == len;
        if (rule) {
            /* Open MPI's help text stands between two rules: its first line says what
             * happened, and stands for the block */
            if (!in_help) head[0] = '\0';
            in_help = !in_help;
            if (!in_help && head[0]) tsr__set_line(p->last_line, sizeof p->last_line, head);
        } else if (len > 0) {
            if (in_help && !head[0]) tsr__set_line(head, sizeof head, l);
            tsr__set_line(p->last_line, sizeof p->last_line, l);
            if (tsr__own_line(l)) {
                tsr__set_line(p->own_line, sizeof p->own_line, l);
                /* of several ranks' lines, the one that says memory ran out says why */
                if (tsr__says_oom(l)) tsr__set_line(own_oom, sizeof own_oom, l);
            }
            int sig = tsr__rank_signal(l);
            if (sig && !p->rank_signal) p->rank_signal = sig;
        }
        if (!nl) break;
        line = nl + 1;
    }
    if (own_oom[0]) tsr__set_line(p->own_line, sizeof p->own_line, own_oom);
}

tsr_status tsr_cell_spawn(char *const argv[], const char *stdout_path, const char *stderr_path,
                          int64_t mem_limit, double time_limit, tsr_cell_tick_fn tick,
                          void *ctx, tsr_cell_proc *out) {
    memset(out, 0, sizeof *out);
    out->exit_code = -1;
    fflush(NULL);
    double t0 = tsr_sys_now();
    pid_t pid = fork();
    if (pid < 0)
        return tsr_error_set(TSR_ERR_IO, "characterize: cannot fork a cell: %s", strerror(errno));
    if (pid == 0) {
        /* Its own process group: the time limit stops mpirun and its ranks together. */
        setpgid(0, 0);
        int in = open("/dev/null", O_RDONLY);
        int o = open(stdout_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int e = open(stderr_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (in < 0 || o < 0 || e < 0 || dup2(in, 0) < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        close(in);
        close(o);
        close(e);
        if (mem_limit > 0) {
            struct rlimit rl = {(rlim_t)mem_limit, (rlim_t)mem_limit};
            if (setrlimit(RLIMIT_AS, &rl) != 0) {
                dprintf(2, "characterize: setrlimit(RLIMIT_AS, %lld): %s\n",
                        (long long)mem_limit, strerror(errno));
                _exit(126);
            }
        }
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGUSR1, SIG_DFL);
        execvp(argv[0], argv);
        dprintf(2, "characterize: cannot execute %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* also from here, whichever runs first */
    int wst = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    double term_at = -1, last_tick = t0;
    for (;;) {
        pid_t r = wait4(pid, &wst, WNOHANG, &ru);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            out->wall_s = tsr_sys_now() - t0;
            return tsr_error_set(TSR_ERR_IO, "characterize: waiting for a cell: %s",
                                 strerror(errno));
        }
        double now = tsr_sys_now();
        bool stop = false;
        if (tick && now - last_tick >= 0.5) {
            last_tick = now;
            stop = tick(ctx, now - t0);
            if (stop && term_at < 0) out->stopped = true;
        }
        if (time_limit > 0 && now - t0 > time_limit && term_at < 0) {
            out->timed_out = true;
            stop = true;
        }
        if (stop && term_at < 0) {
            term_at = now;
            kill(-pid, SIGTERM);
        } else if (term_at >= 0 && now - term_at > TSR_CELL_KILL_GRACE_S) {
            kill(-pid, SIGKILL);
            term_at = now + 1e9; /* once */
        }
        tsr__sleep(0.05);
    }
    /* ranks or helpers left in the group after the launcher ended */
    kill(-pid, SIGKILL);
    out->wall_s = tsr_sys_now() - t0;
    out->maxrss_bytes = (int64_t)ru.ru_maxrss * 1024;
    if (WIFEXITED(wst)) out->exit_code = WEXITSTATUS(wst);
    else if (WIFSIGNALED(wst)) out->signal = WTERMSIG(wst);
    tsr_cell_read_stderr(stderr_path, out);
    return TSR_OK;
}

const char *tsr_cell_classify(const tsr_cell_proc *p, double time_limit, char *reason,
                              size_t cap, int64_t *reached) {
    *reached = -1;
    reason[0] = '\0';
    if (p->timed_out) {
        snprintf(reason, cap, "time limit of %g s", time_limit);
        return "timeout";
    }
    /* tessera's own line says why; the launcher's help text after it does not */
    const char *msg = p->own_line[0] ? p->own_line : p->last_line;
    const char *sep = msg[0] ? "; " : "";
    if (p->signal) {
        /* SIGKILL that we did not send: the kernel's OOM killer (or a cgroup limit) */
        if (p->signal == SIGKILL) {
            snprintf(reason, cap, "killed by SIGKILL (out of memory: the OOM killer)%s%s",
                     msg[0] ? "; last line: " : "", msg);
            return "oom";
        }
        snprintf(reason, cap, "crashed with signal %d (%s)%s%s", p->signal,
                 strsignal(p->signal), msg[0] ? "; last line: " : "", msg);
        /* an allocation that failed under the limit and was not checked ends like this */
        return tsr__says_oom(msg) ? "oom" : "crash";
    }
    if (p->exit_code == 0) return "ok";
    if (!p->own_line[0] && p->rank_signal == SIGKILL) {
        /* a rank the OOM killer ended: it had no chance to say anything */
        snprintf(reason, cap, "a rank was killed by SIGKILL (out of memory: the OOM killer)");
        return "oom";
    }
    if (!tsr__says_oom(msg) && p->rank_signal) {
        snprintf(reason, cap, "a rank crashed with signal %d (%s)%s%s", p->rank_signal,
                 strsignal(p->rank_signal), sep, msg);
        return "crash";
    }
    snprintf(reason, cap, "%s", msg[0] ? msg : "exited with no message");
    size_t used = strlen(reason);
    if (used + 1 < cap) snprintf(reason + used, cap - used, " (exit %d)", p->exit_code);
    if (tsr__says_oom(msg)) {
        /* h2o materialize: "the H x n_q x n_k score matrix": the keys the step reached */
        const char *m = strstr(msg, "the ");
        long long h, q;
        double k;
        while (m) {
            if (sscanf(m, "the %lld x %lld x %lf score matrix", &h, &q, &k) == 3) {
                *reached = (int64_t)k;
                break;
            }
            m = strstr(m + 4, "the ");
        }
        return "oom";
    }
    return "error";
}

/* Filler for prompts: plain sentences in the style of the bundled TinyStories model. */
static const char tsr__filler[] =
    "Once upon a time, there was a little girl named Lily. She liked to play in the park "
    "with her friend Ben. One day, they found a big red ball under a tree. Lily said, \"Let "
    "us play with the ball!\" Ben kicked the ball and it rolled far away. They ran after it "
    "and laughed. The sun was warm and the sky was blue. A small dog came to play with them "
    "too. The dog was happy and wagged its tail. When it was time to go home, Lily gave the "
    "dog a hug. Her mom made soup for dinner, and Lily told her about the ball and the dog. "
    "Tom had a toy boat. He took it to the pond and put it on the water. The boat went fast "
    "in the wind. A duck swam next to the boat and said quack. Tom smiled and waved at the "
    "duck. Then it began to rain, so Tom took his boat and ran inside to his warm bed. ";

tsr_status tsr_cell_write_prompts(const char *path, const char *tokenizer_path,
                                  const char *text_path, int n, int tokens, int max_tokens,
                                  int *actual) {
    *actual = 0;
    if (tokens < 2) return tsr_error_set(TSR_ERR_INVALID, "characterize: prompts need >= 2 tokens");
    tsr_tokenizer *t = NULL;
    TSR_TRY(tsr_tokenizer_load(tokenizer_path, &t));
    char *text = NULL;
    size_t tlen = 0;
    tsr_status st = TSR_OK;
    if (text_path) st = tsr_file_read(text_path, "filler text", 0, &text, &tlen);
    const char *src = text ? text : tsr__filler;
    size_t slen = text ? tlen : sizeof tsr__filler - 1;
    int32_t *unit = NULL, *ids = NULL, *chk = NULL;
    size_t n_unit = 0, n_chk = 0;
    char *buf = NULL;
    FILE *f = NULL;
    if (st == TSR_OK) st = tsr_tokenizer_encode(t, src, slen, false, false, &unit, &n_unit);
    if (st == TSR_OK && n_unit < 8)
        st = tsr_error_set(TSR_ERR_INVALID, "characterize: the filler text is too short");
    /* The token stream is the unit repeated; a prompt is a window of it decoded to text. */
    size_t want = (size_t)tokens - 1; /* BOS comes from tessera run */
    size_t bufcap = want * 64 + 64;
    if (st == TSR_OK) {
        ids = tsr_malloc((want + 16) * sizeof *ids);
        buf = tsr_malloc(bufcap);
        f = fopen(path, "wb");
        if (!ids || !buf) st = TSR_ERR_NOMEM;
        else if (!f)
            st = tsr_error_set(TSR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    for (int i = 0; i < n && st == TSR_OK; i++) {
        size_t off = ((size_t)i * 7 + (size_t)i / (n_unit / 7 + 1)) % n_unit;
        size_t take = want, len = 0;
        for (int tries = 0; tries < 6; tries++) {
            len = 0;
            for (size_t j = 0; j < take; j++) ids[j] = unit[(off + j) % n_unit];
            for (size_t j = 0; j < take; j++) {
                int w = tsr_tokenizer_decode(t, j ? ids[j - 1] : -1, ids[j], buf + len,
                                             bufcap - len - 1);
                if (w < 0) {
                    st = tsr_error_set(TSR_ERR_INTERNAL, "characterize: prompt buffer too small");
                    break;
                }
                len += (size_t)w;
            }
            if (st != TSR_OK) break;
            buf[len] = '\0';
            tsr_free(chk);
            chk = NULL;
            st = tsr_tokenizer_encode(t, buf, len, false, false, &chk, &n_chk);
            if (st != TSR_OK || n_chk == want) break;
            /* merges across the window's edges: shift the window by the difference */
            if (n_chk > want) take = n_chk - want < take ? take - (n_chk - want) : 1;
            else take = take + (want - n_chk) <= want + 16 ? take + (want - n_chk) : want + 16;
        }
        if (st != TSR_OK) break;
        if (i == 0) *actual = (int)n_chk + 1;
        cJSON *req = cJSON_CreateObject();
        cJSON *body = req ? cJSON_CreateObject() : NULL;
        char cid[32];
        snprintf(cid, sizeof cid, "p%d", i);
        if (!req || !body) {
            cJSON_Delete(req);
            cJSON_Delete(body);
            st = TSR_ERR_NOMEM;
            break;
        }
        cJSON_AddStringToObject(req, "custom_id", cid);
        cJSON_AddStringToObject(req, "method", "POST");
        cJSON_AddStringToObject(req, "url", "/v1/completions");
        cJSON_AddStringToObject(body, "prompt", buf);
        cJSON_AddNumberToObject(body, "max_tokens", max_tokens);
        cJSON_AddNumberToObject(body, "temperature", 0);
        cJSON_AddItemToObject(req, "body", body);
        char *line = cJSON_PrintUnformatted(req);
        cJSON_Delete(req);
        if (!line) st = TSR_ERR_NOMEM;
        else if (fprintf(f, "%s\n", line) < 0)
            st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", path, strerror(errno));
        cJSON_free(line);
    }
    if (f && fclose(f) != 0 && st == TSR_OK)
        st = tsr_error_set(TSR_ERR_IO, "%s: write error: %s", path, strerror(errno));
    tsr_free(chk);
    tsr_free(unit);
    tsr_free(ids);
    tsr_free(buf);
    tsr_free(text);
    tsr_tokenizer_destroy(t);
    return st;
}
