/* cluster_node_local.c - prints what ckv's communication layer believes about this rank's place in
 * the job, one line per rank: "rank R of N host H local L of S", where L and S come from
 * ckv_comm_node_local (the node-local rank and size that choose a rank's GPU). The cluster tests
 * start it with mpirun or srun across network-namespace nodes and compare L and S with the hosts
 * the ranks really run on. It computes nothing itself and does not judge the answer. */
#define _POSIX_C_SOURCE 200809L /* gethostname */
#include <stdio.h>
#include <unistd.h>

#include "comm/comm.h"

int main(int argc, char **argv) {
    ckv_comm *world = NULL;
    ckv_status s = ckv_comm_init_world(&world, &argc, &argv);
    if (s != CKV_STATUS_OK) {
        fprintf(stderr, "cluster_node_local: %s\n", ckv_error_message());
        return 1;
    }
    int local = 0, local_size = 1;
    s = ckv_comm_node_local(world, &local, &local_size);
    if (s != CKV_STATUS_OK) {
        fprintf(stderr, "cluster_node_local: rank %d: %s\n", world->rank, ckv_error_message());
        ckv_comm_free(world);
        return 1;
    }
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    /* one line per rank, in rank order, so that the output is the same however stdout interleaves */
    for (int r = 0; r < world->size; r++) {
        if (r == world->rank) {
            printf("rank %d of %d host %s local %d of %d\n", world->rank, world->size, host, local, local_size);
            fflush(stdout);
        }
        if (world->ops->barrier(world) != CKV_STATUS_OK) {
            fprintf(stderr, "cluster_node_local: rank %d: %s\n", world->rank, ckv_error_message());
            ckv_comm_free(world);
            return 1;
        }
    }
    ckv_comm_free(world);
    return 0;
}
