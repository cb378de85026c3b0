/* The start of a distributed job as jobs/main.c does it, reduced to what can go wrong:
 *   test_layout_error layout TP PP   -> tsr_comm_set_layout(TP, PP)
 *   test_layout_error fail RANK      -> RANK fails its start-up (a missing shard)
 *   test_layout_error die RANK       -> RANK exits at once, without MPI_Finalize
 * Failures are agreed on, rank 0 alone prints "tessera: <reason>", every rank exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_layout_error layout TP PP | fail RANK | die RANK\n");
        return 2;
    }
    tsr_comm *c = NULL;
    tsr_comm_options o = {.backend = TSR_COMM_AUTO, .argc = &argc, .argv = &argv};
    tsr_status st = tsr_comm_init(&o, &c);
    if (st != TSR_OK) {
        fprintf(stderr, "tessera: %s\n", tsr_last_error());
        return 1;
    }
    int rank = tsr_comm_world_rank(c);
    if (strcmp(argv[1], "layout") == 0 && argc >= 4) {
        st = tsr_comm_set_layout(c, atoi(argv[2]), atoi(argv[3]));
    } else if (strcmp(argv[1], "fail") == 0) {
        if (rank == atoi(argv[2]))
            st = tsr_error_set(TSR_ERR_IO, "models/missing.bin: cannot open (No such file)");
    } else if (strcmp(argv[1], "die") == 0) {
        if (rank == atoi(argv[2])) _Exit(3);
        /* The survivors block in a collective; the launcher must end them. */
        if (rank == 0) {
            fprintf(stderr, "test_layout_error: rank 0 waits in a barrier\n");
            fflush(stderr);
        }
        st = tsr_comm_barrier(c, TSR_COMM_WORLD);
    }
    st = tsr_comm_agree(c, st);
    if (st != TSR_OK && rank == 0) fprintf(stderr, "tessera: %s\n", tsr_last_error());
    tsr_comm_destroy(c);
    return st == TSR_OK ? 0 : 1;
}
