/* The watchdog (tsr_comm_set_timeout) on 2 or 4 ranks, through the comm alone:
 *   test_comm_watchdog stop OP   -> the last rank stops itself (SIGSTOP) before OP; the
 *                                   others' timeout (2 s) ends the job with one line each
 *   test_comm_watchdog die OP    -> the last rank kills itself (SIGKILL) before OP; the
 *                                   others name it at once (well before the timeout)
 *   test_comm_watchdog suspend   -> rank 0 is stopped for 3 s while it waits in a barrier
 *                                   for rank 1, which arrives after 4 s (timeout 2 s): the
 *                                   time rank 0 itself was stopped (a suspended job) does
 *                                   not count, the barrier completes, exit 0
 *   test_comm_watchdog fast      -> 20000 small allreduces with the watchdog on and off:
 *                                   polling must not make them slower (prints both times;
 *                                   fails above twice the time without, plus 0.2 s)
 * OP: allreduce (the chain sum on the tp group of a tp = world layout), recv (rank 0
 * receives from the last rank on the world group), barrier, bcast, allgather, wait (an
 * irecv completed by tsr_comm_wait).
 * The survivors ignore SIGTERM, as `tessera run` does (it turns it into a stop request), so
 * that the launcher's teardown does not end them before their own line. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tsr_status op_run(tsr_comm *c, const char *op) {
    int rank = tsr_comm_world_rank(c), last = tsr_comm_world_size(c) - 1;
    float v[64] = {0};
    char recv[4 * 64];
    if (strcmp(op, "allreduce") == 0) return tsr_comm_allreduce_sum_f32(c, TSR_COMM_TP, v, 64);
    if (strcmp(op, "barrier") == 0) return tsr_comm_barrier(c, TSR_COMM_WORLD);
    if (strcmp(op, "bcast") == 0) return tsr_comm_bcast(c, TSR_COMM_WORLD, v, sizeof v, last);
    if (strcmp(op, "allgather") == 0)
        return tsr_comm_allgather(c, TSR_COMM_WORLD, v, 4, recv);
    if (strcmp(op, "recv") == 0) {
        if (rank == 0) return tsr_comm_recv(c, TSR_COMM_WORLD, v, sizeof v, last, 7);
        if (rank == last) return tsr_comm_send(c, TSR_COMM_WORLD, v, sizeof v, 0, 7);
        return TSR_OK;
    }
    if (strcmp(op, "wait") == 0) {
        tsr_comm_request rq;
        if (rank == 0) {
            tsr_status st = tsr_comm_irecv(c, TSR_COMM_WORLD, v, sizeof v, last, 7, &rq);
            return st != TSR_OK ? st : tsr_comm_wait(c, &rq);
        }
        if (rank == last) return tsr_comm_send(c, TSR_COMM_WORLD, v, sizeof v, 0, 7);
        return TSR_OK;
    }
    return tsr_error_set(TSR_ERR_INVALID, "unknown op %s", op);
}

static double time_allreduces(tsr_comm *c, int n) {
    float v[256];
    for (int i = 0; i < 256; i++) v[i] = 1.0f;
    (void)tsr_comm_barrier(c, TSR_COMM_WORLD);
    double t0 = now();
    for (int i = 0; i < n; i++)
        if (tsr_comm_allreduce_sum_f32(c, TSR_COMM_TP, v, 256) != TSR_OK) return -1;
    (void)tsr_comm_barrier(c, TSR_COMM_WORLD);
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_comm_watchdog stop OP | die OP | fast\n");
        return 2;
    }
    tsr_comm *c = NULL;
    tsr_comm_options o = {.backend = TSR_COMM_MPI, .argc = &argc, .argv = &argv};
    if (tsr_comm_init(&o, &c) != TSR_OK || tsr_comm_set_layout(c, tsr_comm_world_size(c), 1) != TSR_OK) {
        fprintf(stderr, "test_comm_watchdog: %s\n", tsr_last_error());
        return 1;
    }
    int rank = tsr_comm_world_rank(c), last = tsr_comm_world_size(c) - 1;
    if (tsr_comm_timeout(c) != TSR_COMM_DEFAULT_TIMEOUT) {
        fprintf(stderr, "test_comm_watchdog: default timeout %g\n", tsr_comm_timeout(c));
        return 1;
    }
    if (strcmp(argv[1], "fast") == 0) {
        /* Alternated, best of 3: the machine is shared, one slow run means nothing. */
        double on = 1e9, off = 1e9;
        for (int k = 0; k < 3; k++) {
            tsr_comm_set_timeout(c, 600);
            double t = time_allreduces(c, 20000);
            if (t >= 0 && t < on) on = t;
            tsr_comm_set_timeout(c, 0);
            t = time_allreduces(c, 20000);
            if (t >= 0 && t < off) off = t;
        }
        if (rank == 0)
            printf("test_comm_watchdog: 20000 allreduces of 1 KiB: watchdog on %.3f s, "
                   "off %.3f s\n", on, off);
        tsr_comm_destroy(c);
        /* Loose on purpose (a shared machine): catches a wait that pauses before testing,
         * not noise. */
        if (on < 0 || off < 0 || on > 2 * off + 0.2) {
            if (rank == 0) printf("test_comm_watchdog: the watchdog makes them slower\n");
            return 1;
        }
        return 0;
    }
    if (strcmp(argv[1], "suspend") == 0) {
        tsr_comm_set_timeout(c, 2);
        pid_t child = -1;
        if (rank == 0) {
            pid_t parent = getpid();
            child = fork();
            if (child == 0) { /* only sleeps and signals: safe in a forked MPI process */
                struct timespec a = {0, 500000000}, b = {3, 0};
                nanosleep(&a, NULL);
                kill(parent, SIGSTOP);
                nanosleep(&b, NULL);
                kill(parent, SIGCONT);
                _exit(0);
            }
        } else {
            struct timespec d = {4, 0};
            nanosleep(&d, NULL);
        }
        double t0 = now();
        tsr_status st = tsr_comm_barrier(c, TSR_COMM_WORLD);
        if (child > 0) waitpid(child, NULL, 0);
        printf("test_comm_watchdog: rank %d: barrier %s after %.1f s\n", rank,
               st == TSR_OK ? "ok" : tsr_last_error(), now() - t0);
        tsr_comm_destroy(c);
        return st == TSR_OK ? 0 : 1;
    }
    if (argc < 3) return 2;
    signal(SIGTERM, SIG_IGN);
    tsr_comm_set_timeout(c, 2);
    /* A few rounds of the operation work first: the watchdog is quiet on a healthy job. */
    for (int i = 0; i < 50; i++)
        if (op_run(c, argv[2]) != TSR_OK) {
            fprintf(stderr, "test_comm_watchdog: %s\n", tsr_last_error());
            return 1;
        }
    if (rank == last) raise(strcmp(argv[1], "die") == 0 ? SIGKILL : SIGSTOP);
    double t0 = now();
    tsr_status st = op_run(c, argv[2]);
    fprintf(stderr, "test_comm_watchdog: rank %d: %s returned %d after %.1f s (expected the "
            "watchdog to end the job)\n", rank, argv[2], (int)st, now() - t0);
    return 1;
}
