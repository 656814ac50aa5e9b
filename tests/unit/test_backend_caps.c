/* test_backend_caps.c - the backend capability query (backend/backend.h): what the cpu and cuda-emu
 * backends declare, that every declared family's ops are set and no undeclared family's are, that
 * the table check names the op and the family of a table that disagrees with its mask, and the
 * query's answers for a NULL backend and out-of-range families. No op is run. */
#include "backend/backend.h"
#include "ckv_test.h"
#include "core/status.h"

/* Family -> 1 when the backend called `name` must offer it. */
typedef struct {
    ckv_backend_cap cap;
    int cpu, cuda;
} expected_cap;

static const expected_cap expected[] = {
    {CKV_BACKEND_CAP_STREAM, 0, 1},   {CKV_BACKEND_CAP_DEVICE_ID, 0, 1}, {CKV_BACKEND_CAP_EVICT_RESERVE, 0, 1},
    {CKV_BACKEND_CAP_KEYDIFF, 1, 1},  {CKV_BACKEND_CAP_LAGKV, 1, 1},     {CKV_BACKEND_CAP_CUR, 1, 1},
    {CKV_BACKEND_CAP_LEVERAGE, 1, 1}, {CKV_BACKEND_CAP_CHUNK_COLSUM, 1, 1}, {CKV_BACKEND_CAP_GRAPHS, 0, 1},
    {CKV_BACKEND_CAP_KVZIP, 1, 1},    {CKV_BACKEND_CAP_CHUNK_RANK, 1, 1}, {CKV_BACKEND_CAP_MEM_USAGE, 0, 1},
};

static void test_declared(const char *name, int is_cuda) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, name, 1));
    if (!be) return;
    CHECK_OK(ckv_backend_check_ops(be));
    CHECK((int)(sizeof expected / sizeof expected[0]) == (int)CKV_BACKEND_CAP_COUNT);
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const int want = is_cuda ? expected[i].cuda : expected[i].cpu;
        const int got = ckv_backend_supports(be, expected[i].cap);
        CHECK_MSG(got == want, "%s backend: supports(%s) = %d, expected %d", name,
                  ckv_backend_cap_name(expected[i].cap), got, want);
    }
    /* the ops a family names are set exactly when it is declared */
    const ckv_backend_ops *o = be->ops;
    CHECK((o->stream != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_STREAM));
    CHECK((o->device_id != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_DEVICE_ID));
    CHECK((o->evict_reserve != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_EVICT_RESERVE));
    CHECK((o->evict_chunk_colsum != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_CHUNK_COLSUM));
    CHECK((o->evict_row_stats != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_CHUNK_COLSUM));
    CHECK((o->graph_begin != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_GRAPHS));
    CHECK((o->graph_end != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_GRAPHS));
    CHECK((o->graph_release != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_GRAPHS));
    CHECK((o->evict_kvzip != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_KVZIP));
    CHECK((o->evict_kvzip_norms != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_KVZIP));
    CHECK((o->evict_chunk_rank != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_CHUNK_RANK));
    CHECK((o->mem_usage != NULL) == ckv_backend_supports(be, CKV_BACKEND_CAP_MEM_USAGE));
    /* the stream helper answers from the query */
    CHECK((ckv_backend_stream(be) != NULL) == is_cuda);
    ckv_backend_free(be);
}

/* A copy of the cpu table edited to disagree with its mask: the check names the op and the family. */
static void test_check_rejects(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!be) return;
    const ckv_backend_ops *orig = be->ops;
    ckv_backend_ops t = *orig;
    be->ops = &t;

    t.evict_keydiff = NULL; /* declared, missing */
    CHECK_FAILS(ckv_backend_check_ops(be), CKV_STATUS_ERR_INTERNAL, "op evict_keydiff is missing");
    CHECK_FAILS(ckv_backend_check_ops(be), CKV_STATUS_ERR_INTERNAL, "declares capability keydiff");
    t = *orig;
    t.evict_row_stats = NULL; /* half a family */
    CHECK_FAILS(ckv_backend_check_ops(be), CKV_STATUS_ERR_INTERNAL, "evict_row_stats is missing");
    t = *orig;
    t.caps |= CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_DEVICE_ID); /* declared without its op */
    CHECK_FAILS(ckv_backend_check_ops(be), CKV_STATUS_ERR_INTERNAL, "capability device_id");
    t = *orig;
    t.caps &= ~CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_LEVERAGE); /* set but undeclared */
    CHECK_FAILS(ckv_backend_check_ops(be), CKV_STATUS_ERR_INTERNAL, "op evict_leverage is set");
    CHECK(!ckv_backend_supports(be, CKV_BACKEND_CAP_LEVERAGE));
    t = *orig;
    t.matmul = NULL; /* a required op */
    CHECK_FAILS(ckv_backend_check_ops(be), CKV_STATUS_ERR_INTERNAL, "lacks matmul");
    t = *orig;
    t.caps |= 1u << 31; /* an unknown family */
    CHECK_FAILS(ckv_backend_check_ops(be), CKV_STATUS_ERR_INTERNAL, "bits beyond");
    t = *orig;
    CHECK_OK(ckv_backend_check_ops(be));

    be->ops = orig;
    ckv_backend_free(be);
}

static void test_edges(void) {
    CHECK(ckv_backend_supports(NULL, CKV_BACKEND_CAP_KEYDIFF) == 0);
    CHECK(ckv_backend_stream(NULL) == NULL);
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!be) return;
    CHECK(ckv_backend_supports(be, CKV_BACKEND_CAP_COUNT) == 0);
    CHECK(ckv_backend_supports(be, (ckv_backend_cap)-1) == 0);
    CHECK(strcmp(ckv_backend_cap_name(CKV_BACKEND_CAP_COUNT), "?") == 0);
    CHECK(strcmp(ckv_backend_cap_name(CKV_BACKEND_CAP_CHUNK_COLSUM), "chunk_colsum") == 0);
    CHECK(strcmp(ckv_backend_cap_name(CKV_BACKEND_CAP_GRAPHS), "graphs") == 0);
    for (int c = 0; c < (int)CKV_BACKEND_CAP_COUNT; c++)
        CHECK_MSG(ckv_backend_cap_name((ckv_backend_cap)c) && strcmp(ckv_backend_cap_name((ckv_backend_cap)c), "?"),
                  "family %d has no name", c);
    CHECK_FAILS(ckv_backend_check_ops(NULL), CKV_STATUS_ERR_ARG, "no backend");
    ckv_backend_free(be);
}

int main(void) {
    test_declared("cpu", 0);
    test_declared("cuda-emu", 1);
    test_check_rejects();
    test_edges();
    return ckv_test_finish("test_backend_caps");
}
