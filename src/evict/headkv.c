/* headkv.c - HeadKV profiles and budgets (see headkv.h): JSON loading with schema and shape checks,
 * and HeadKV's allocation (ReasonSnapKVCluster: normalise the importance, temperature, a base share
 * base - base // beta for every head plus an importance-proportional share of a pool of
 * (base // beta) * heads tokens, rounded half to even, the window kept on top). Floor division and
 * rounding follow Python/torch exactly (fmod-based floor division, ties to even) so that budgets equal
 * the reference port's (tools/oracle/headkv_reference.py). It neither scores nor selects tokens and
 * never prints. */
#include "evict/headkv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"

static void copy_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src ? src : "");
}

static ckv_status get_count(const ckv_json *root, const char *path, const char *key, int *out) {
    const ckv_json *j = ckv_json_get(root, key);
    if (!ckv_json_is_number(j))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"%s\" must be a positive integer", path, key);
    const double v = ckv_json_number(j);
    if (!(v >= 1.0 && v <= 1e6 && v == floor(v)))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"%s\" must be a positive integer, got %g", path,
                         key, v);
    *out = (int)v;
    return CKV_STATUS_OK;
}

static ckv_status get_param(const ckv_json *root, const char *path, const char *key, double dflt, double *out) {
    const ckv_json *j = ckv_json_get(root, key);
    if (ckv_json_is_null(j)) {
        *out = dflt;
        return CKV_STATUS_OK;
    }
    if (!ckv_json_is_number(j) || !isfinite(ckv_json_number(j)))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"%s\" must be a number", path, key);
    *out = ckv_json_number(j);
    return CKV_STATUS_OK;
}

static ckv_status parse_profile(ckv_headkv_profile *p, const ckv_json *root, const char *path, int n_layers,
                                int n_kv_heads) {
    if (!ckv_json_is_object(root))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: expected a JSON object", path);
    const ckv_json *fmt = ckv_json_get(root, "format");
    if (!ckv_json_is_null(fmt) && !(ckv_json_is_string(fmt) && !strcmp(ckv_json_string(fmt), "ckv-headkv-profile")))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"format\" is not \"ckv-headkv-profile\" (convert "
                         "HeadKV's own files with tools/oracle/headkv_profile.py)", path);
    int nl = 0, nh = 0;
    CKV_TRY(get_count(root, path, "n_layers", &nl));
    CKV_TRY(get_count(root, path, "n_kv_heads", &nh));
    if ((n_layers > 0 && nl != n_layers) || (n_kv_heads > 0 && nh != n_kv_heads))
        return ckv_error(CKV_STATUS_ERR_SHAPE, "profile %s has %d layers x %d KV heads, the model %d x %d", path, nl, nh,
                         n_layers > 0 ? n_layers : nl, n_kv_heads > 0 ? n_kv_heads : nh);
    const ckv_json *sc = ckv_json_get(root, "scores");
    if (!ckv_json_is_array(sc))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"scores\" must be an array of %d layers", path, nl);
    if (ckv_json_array_size(sc) != nl)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"scores\" has %d rows, \"n_layers\" says %d", path,
                         ckv_json_array_size(sc), nl);
    CKV_TRY(ckv_alloc((void **)&p->scores, (size_t)nl * (size_t)nh * sizeof(double), "headkv profile scores"));
    p->n_layers = nl;
    p->n_kv_heads = nh;
    double total = 0.0;
    for (int l = 0; l < nl; l++) {
        const ckv_json *row = ckv_json_array_at(sc, l);
        if (!ckv_json_is_array(row) || ckv_json_array_size(row) != nh)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: scores[%d] must hold %d numbers (\"n_kv_heads\")",
                             path, l, nh);
        for (int h = 0; h < nh; h++) {
            const ckv_json *v = ckv_json_array_at(row, h);
            const double x = ckv_json_is_number(v) ? ckv_json_number(v) : -1.0;
            if (!ckv_json_is_number(v) || !isfinite(x) || x < 0.0)
                return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: scores[%d][%d] must be a number >= 0", path,
                                 l, h);
            p->scores[(size_t)l * nh + h] = x;
            total += x;
        }
    }
    if (!(total > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: every importance score is 0", path);
    CKV_TRY(get_param(root, path, "beta", CKV_HEADKV_DEFAULT_BETA, &p->beta));
    CKV_TRY(get_param(root, path, "temp", CKV_HEADKV_DEFAULT_TEMP, &p->temp));
    if (p->beta < 1.0) return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"beta\" %g must be >= 1", path, p->beta);
    if (!(p->temp > 0.0)) return ckv_error(CKV_STATUS_ERR_FORMAT, "headkv profile %s: \"temp\" %g must be > 0", path, p->temp);
    const ckv_json *model = ckv_json_get(root, "model"), *source = ckv_json_get(root, "source");
    copy_str(p->model, sizeof p->model, ckv_json_is_string(model) ? ckv_json_string(model) : "");
    copy_str(p->source, sizeof p->source, ckv_json_is_string(source) ? ckv_json_string(source) : "");
    return CKV_STATUS_OK;
}

ckv_status ckv_headkv_load(ckv_headkv_profile *p, const char *path, int n_layers, int n_kv_heads) {
    if (!p) return ckv_error(CKV_STATUS_ERR_ARG, "ckv_headkv_load: no profile");
    memset(p, 0, sizeof *p);
    if (!path || !*path) return ckv_error(CKV_STATUS_ERR_ARG, "headkv: no profile file given (--profile FILE)");
    ckv_json *root = NULL;
    ckv_status s = ckv_json_parse_file(&root, path);
    if (s != CKV_STATUS_OK) return s; /* the message names the file (unreadable / invalid JSON) */
    s = parse_profile(p, root, path, n_layers, n_kv_heads);
    ckv_json_free(root);
    if (s != CKV_STATUS_OK) {
        ckv_headkv_free(p);
        return s;
    }
    p->window = 0;
    copy_str(p->path, sizeof p->path, path);
    return CKV_STATUS_OK;
}

void ckv_headkv_free(ckv_headkv_profile *p) {
    if (!p) return;
    ckv_free(p->scores);
    memset(p, 0, sizeof *p);
}

/* Python's float a // b for a >= 0, b > 0 (CPython's float divmod: the fmod-based quotient snapped to
 * the nearest integer), which is not always floor(a / b). */
static double py_floordiv(double a, double b) {
    const double mod = fmod(a, b);
    const double div = (a - mod) / b;
    if (div == 0.0) return 0.0;
    double q = floor(div);
    if (div - q > 0.5) q += 1.0;
    return q;
}

/* torch.round: to nearest, ties to even. */
static double round_half_even(double x) {
    const double r = floor(x), frac = x - r;
    if (frac > 0.5) return r + 1.0;
    if (frac < 0.5) return r;
    return fmod(r, 2.0) == 0.0 ? r : r + 1.0;
}

ckv_status ckv_headkv_budgets(const ckv_headkv_profile *p, int L, int n_kept_mean, int32_t *budgets) {
    if (!p || !p->scores || !budgets) return ckv_error(CKV_STATUS_ERR_ARG, "headkv budgets: no profile loaded");
    const int window = p->window;
    if (L < 1 || n_kept_mean < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "headkv budgets: context %d / kept count %d must be >= 1", L, n_kept_mean);
    if (window < 0 || window >= L)
        return ckv_error(CKV_STATUS_ERR_ARG, "headkv budgets: window %d outside [0, %d)", window, L);
    if (p->beta < 1.0 || !isfinite(p->beta))
        return ckv_error(CKV_STATUS_ERR_ARG, "headkv budgets: beta %g must be >= 1", p->beta);
    if (!(p->temp > 0.0) || !isfinite(p->temp))
        return ckv_error(CKV_STATUS_ERR_ARG, "headkv budgets: temp %g must be > 0", p->temp);
    const size_t n = (size_t)p->n_layers * (size_t)p->n_kv_heads;
    const int base = n_kept_mean - window;
    if (base < 0 || base > L - window) { /* below the window: uniform; HeadKV's "nothing to compress" */
        const int all = base < 0 ? (n_kept_mean < L ? n_kept_mean : L) : L;
        for (size_t i = 0; i < n; i++) budgets[i] = all;
        return CKV_STATUS_OK;
    }
    double *share = NULL;
    CKV_TRY(ckv_alloc((void **)&share, n * sizeof(double), "headkv shares"));
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += p->scores[i];
    for (size_t i = 0; i < n; i++) share[i] = p->scores[i] / sum;
    double sum2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        share[i] = pow(share[i], p->temp);
        sum2 += share[i];
    }
    for (size_t i = 0; i < n; i++) share[i] /= sum2;
    const double q = py_floordiv((double)base, p->beta);
    const double pool = q * (double)p->n_layers * (double)p->n_kv_heads; /* HeadKV's evaluation order */
    const double min_num = (double)base - q;
    for (size_t i = 0; i < n; i++) {
        double cap = round_half_even(share[i] * pool + min_num);
        if (cap > (double)(L - window)) cap = (double)(L - window);
        int b = (int)cap + window;
        budgets[i] = b < 1 ? 1 : (b > L ? L : b);
    }
    ckv_free(share);
    return CKV_STATUS_OK;
}
