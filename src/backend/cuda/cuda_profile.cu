/* cuda_profile.cu - the op profile of CKV_CUDA_SYNC=2: with a wait after every op (as CKV_CUDA_SYNC=1),
 * each op's name, calls and the wall time from the previous op's end to its own end (its launch and
 * kernels, and whatever the host did since the previous op: staging, planning, downloads), printed
 * to stderr by op time when the backend is freed. It shows where a whole run's time goes on a GPU
 * without a profiler (tests/gpu/run.sh runs one case this way). It times nothing itself on the
 * device and changes no result; waits after every op slow a run and turn the recorded decode steps
 * off, so its times are an upper bound of each op's share. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "core/alloc.h"
#include "core/timer.h"
}

namespace CKV_CUDA_NS {

enum { PROFILE_OPS = 128 }; /* distinct op names; more are counted as "(other ops)" */

struct op_profile {
    double last;                    /* when the previous op ended (ckv_time_now) */
    double start;                   /* when the profile began */
    int n;                          /* names in use */
    const char *name[PROFILE_OPS];  /* [n] the ops' names (string literals of op_done's callers) */
    long long calls[PROFILE_OPS];   /* [n] */
    double sec[PROFILE_OPS];        /* [n] wall seconds */
};

ckv_status op_profile_init(ctx *c) {
    void *mem = NULL;
    CKV_TRY(ckv_alloc(&mem, sizeof(op_profile), "the cuda op profile"));
    c->prof = (op_profile *)mem;
    memset(c->prof, 0, sizeof *c->prof);
    c->prof->start = c->prof->last = ckv_time_now();
    return CKV_STATUS_OK;
}

void op_profile_add(ctx *c, const char *op, double entered) {
    op_profile *p = c->prof;
    const double now = ckv_time_now();
    if (p->n == 0) { /* the time before the first op reached op_done (loading the weights) is not its time */
        p->name[0] = "(before the first op: loading)";
        p->calls[0] = 1;
        p->sec[0] = entered - p->last;
        p->last = entered;
        p->n = 1;
    }
    int i = 0;
    while (i < p->n && p->name[i] != op && strcmp(p->name[i], op)) i++;
    if (i == p->n) {
        if (p->n < PROFILE_OPS - 1) {
            p->name[p->n++] = op;
        } else {
            i = PROFILE_OPS - 1;
            p->name[i] = "(other ops)";
            p->n = PROFILE_OPS;
        }
    }
    p->calls[i]++;
    p->sec[i] += now - p->last;
    p->last = now;
}

void op_profile_free(ctx *c) {
    op_profile *p = c->prof;
    if (!p) return;
    double total = 0.0;
    for (int i = 0; i < p->n; i++) total += p->sec[i];
    fprintf(stderr,
            "ckv: %s op profile (CKV_CUDA_SYNC=2: a wait after every op; time from the previous op's end, host "
            "work between ops included): %.3f s in ops of %.3f s since the backend started\n",
            CKV_CUDA_BACKEND_NAME, total, ckv_time_now() - p->start);
    int done[PROFILE_OPS] = {0};
    for (int k = 0; k < p->n; k++) { /* by time, largest first */
        int b = -1;
        for (int i = 0; i < p->n; i++)
            if (!done[i] && (b < 0 || p->sec[i] > p->sec[b])) b = i;
        done[b] = 1;
        fprintf(stderr, "ckv:   %-34s %9lld calls %10.4f s %6.1f%%  %9.1f us/call\n", p->name[b], p->calls[b],
                p->sec[b], total > 0.0 ? 100.0 * p->sec[b] / total : 0.0, 1e6 * p->sec[b] / (double)p->calls[b]);
    }
    ckv_free(p);
    c->prof = NULL;
}

} // namespace CKV_CUDA_NS
