/* test_comm_device.c - the device communicator on one process: the path selection rule (host
 * memory, one rank, ranks sharing a device, no NCCL, one GPU per rank), a one-rank device
 * communicator over the single-process one (collectives are copies, workspace reuse), the
 * timeout parameters' defaults and inheritance. Multi-rank behaviour: tests/mpi/comm_ranks.c. */
#include "ckv_test.h"
#include "comm/comm.h"
#include "engine/comm_backend.h"

#define ID 16

static void set_ids(char *ids, const char *const *v, int n) {
    memset(ids, 0, (size_t)n * ID);
    for (int i = 0; i < n; i++) snprintf(ids + (size_t)i * ID, ID, "%s", v[i]);
}

static void test_choose(void) {
    char ids[4 * ID], why[256];
    const char *distinct[] = {"h/0000:1b", "h/0000:2c", "h/0000:3d", "h/0000:4e"};
    const char *shared[] = {"h/0000:1b", "h/0000:2c", "h/0000:1b", "h/0000:4e"};
    set_ids(ids, distinct, 4);
    CHECK(ckv_comm_choose_path(ids, 4, ID, 1, 1, why, sizeof why) == CKV_COMM_PATH_HOST);
    CHECK(strstr(why, "host memory") != NULL);
    CHECK(ckv_comm_choose_path(ids, 4, ID, 0, 1, why, sizeof why) == CKV_COMM_PATH_NCCL);
    CHECK(ckv_comm_choose_path(ids, 4, ID, 0, 0, why, sizeof why) == CKV_COMM_PATH_STAGED);
    CHECK_MSG(strstr(why, "no NCCL") != NULL, "why: %s", why);
    CHECK(ckv_comm_choose_path(ids, 1, ID, 0, 1, why, sizeof why) == CKV_COMM_PATH_STAGED);
    set_ids(ids, shared, 4);
    CHECK(ckv_comm_choose_path(ids, 4, ID, 0, 1, why, sizeof why) == CKV_COMM_PATH_STAGED);
    CHECK_MSG(strstr(why, "ranks 0 and 2 share device h/0000:1b") != NULL, "why: %s", why);
    /* the same bus id on two hosts is two devices */
    const char *two_hosts[] = {"a/0000:1b", "b/0000:1b"};
    set_ids(ids, two_hosts, 2);
    CHECK(ckv_comm_choose_path(ids, 2, ID, 0, 1, why, sizeof why) == CKV_COMM_PATH_NCCL);
    CHECK(!strcmp(ckv_comm_path_name(CKV_COMM_PATH_STAGED), "staged"));
}

static void test_one_rank(void) {
    ckv_comm *single = NULL, *dc = NULL;
    CHECK_OK(ckv_comm_init_single(&single));
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!single || !be) return;
    CHECK(single->timeout_s == 0); /* a lone process has nobody to wait for */
    ckv_comm_device_io io;
    ckv_comm_device_io_from_backend(&io, be);
    CHECK(io.host_memory == 1);
    io.host_memory = 0; /* pretend: a one-rank device communicator copies */
    ckv_comm_device_params p = {.device = 0, .path = CKV_COMM_PATH_AUTO, .staging_bytes = 0, .workspace_bytes = 256};
    CHECK_OK(ckv_comm_init_device(&dc, single, &io, &p));
    if (dc) {
        CHECK(ckv_comm_has_device_ops(dc) && !ckv_comm_has_device_ops(single));
        float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {0};
        CHECK_OK(ckv_comm_dev_allreduce_f32(dc, a, 8, CKV_COMM_OP_SUM));
        CHECK_OK(ckv_comm_dev_allgather(dc, a, b, sizeof a));
        ckv_test_allclose("one-rank device all-gather", b, a, 8, 0, 0);
        void *w1 = NULL, *w2 = NULL;
        CHECK_OK(ckv_comm_dev_workspace(dc, 200, &w1));
        CHECK_OK(ckv_comm_dev_workspace(dc, 256, &w2));
        CHECK(w1 && w1 == w2); /* preallocated: reused, not reallocated */
        ckv_comm_set_stream(dc, NULL);
        CHECK(ckv_backend_stream(be) == NULL); /* the CPU backend has no queue */
        ckv_comm_use_backend_stream(dc, be);
        CHECK(!ckv_comm_device_on_stream(dc) && !ckv_comm_device_on_stream(single));
    }
    void *w = NULL;
    CHECK_FAILS(ckv_comm_dev_workspace(single, 16, &w), CKV_STATUS_ERR_ARG, "device communicator");
    ckv_comm_free(dc);
    ckv_comm_params cp;
    ckv_comm_params_default(&cp);
    CHECK(cp.timeout_s == CKV_COMM_TIMEOUT_DEFAULT_S);
    ckv_comm_free(single);
    ckv_backend_free(be);
}

int main(void) {
    test_choose();
    test_one_rank();
    return ckv_test_finish("test_comm_device");
}
