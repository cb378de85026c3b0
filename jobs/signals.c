/* Signal flag for a graceful stop. The handler does one thing, async-signal-safe: it
 * remembers the first signal in a sig_atomic_t. Everything else (finishing the step,
 * messages, exit code) happens in normal code that polls tsr_signals_stop_requested(). */
#include "jobs/signals.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t tsr__signo;

static const int tsr__sigs[] = {SIGTERM, SIGINT, SIGUSR1};
enum { TSR__N_SIGS = sizeof tsr__sigs / sizeof tsr__sigs[0] };

static void tsr__handler(int sig) {
    /* Keep the first: Slurm may send USR1 and then TERM, the first says why. */
    if (!tsr__signo) tsr__signo = sig;
}

tsr_status tsr_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tsr__handler;
    sa.sa_flags = SA_RESTART; /* a write/fsync in progress completes instead of EINTR */
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < TSR__N_SIGS; i++) sigaddset(&sa.sa_mask, tsr__sigs[i]);
    for (int i = 0; i < TSR__N_SIGS; i++)
        if (sigaction(tsr__sigs[i], &sa, NULL) != 0)
            return tsr_error_set(TSR_ERR_INTERNAL, "sigaction(%s): %s",
                                 tsr_signals_name(tsr__sigs[i]), strerror(errno));
    return TSR_OK;
}

void tsr_signals_restore(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < TSR__N_SIGS; i++) sigaction(tsr__sigs[i], &sa, NULL);
}

bool tsr_signals_stop_requested(int *signo) {
    int s = tsr__signo;
    if (signo) *signo = s;
    return s != 0;
}

void tsr_signals_clear(void) { tsr__signo = 0; }

const char *tsr_signals_name(int signo) {
    static char buf[32];
    switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: snprintf(buf, sizeof buf, "signal %d", signo); return buf;
    }
}
