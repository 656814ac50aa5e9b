/* press.c - the press builder, driven by the registry (press_table.c): parses specs
 * ("critical_adakv:snapkv") against the press and wrapper tables, applies defaults and options by
 * their table entries, sets the budget, checks what a request must give and writes the canonical
 * spec echoed in outputs. Turning a budget into kept counts is press_kept.c. No scoring, no
 * selection. */
#include "evict/press.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "evict/press_registry.h"

/* "a, b, c" of the table's names, for errors. */
static const char *known_presses(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < ckv_press_count && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", ckv_press_table[i].name);
    for (int i = 0; i < ckv_wrapper_count && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s:", i ? ", " : "; optionally behind a wrapper (two: key_rerotation:critical:P; composed:P1+P2+... with wrapped members): ",
                              ckv_wrapper_table[i].name);
    if (n < cap) snprintf(buf + n, cap - n, " (e.g. critical_adakv:snapkv)");
    return buf;
}

static const char *known_options(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < ckv_press_option_count && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", ckv_press_option_table[i].key);
    return buf;
}

/* The press's wrappers, outermost first: w[0] (NULL: none) and the critical: stacked under it (NULL:
 * none; per_layer:critical:knorm is per_layer's allocation with critical set). A composed press's is
 * composed: alone; its members' wrappers are those of their stages (ckv_press_stage). */
static void wrappers_of(const ckv_press_config *c, const ckv_wrapper_def *w[2]) {
    w[0] = ckv_wrapper_def_of(c->composed ? 0 : c->critical, c->alloc, c->rerotate_keys, c->composed);
    w[1] = NULL;
    if (!w[0] && c->critical) {
        w[0] = ckv_wrapper_def_of(0, c->alloc, c->rerotate_keys, c->composed);
        w[1] = ckv_wrapper_def_of(1, CKV_ALLOC_UNIFORM, 0, 0);
    }
}

const char *ckv_scorer_name(ckv_scorer_kind k) {
    const ckv_press_def *d = ckv_press_def_of(k);
    return d ? d->name : "?";
}

int ckv_press_evicts(const ckv_press_config *c) {
    return c->scorer != CKV_SCORER_NONE;
}

int ckv_press_is_press(const char *name, int len) {
    return len >= 0 && ckv_press_def_find(name, (size_t)len) != NULL;
}

int ckv_press_takes(const ckv_press_config *c, const char *key) {
    const ckv_press_def *d = ckv_press_def_of(c->scorer);
    const ckv_wrapper_def *w[2];
    const size_t n = strlen(key);
    wrappers_of(c, w);
    for (int i = 0; c->composed && i < c->n_stages; i++) { /* composed: its members' options too */
        ckv_press_config sc;
        ckv_press_stage(c, i, &sc);
        if (ckv_press_takes(&sc, key)) return 1;
    }
    return (d && ckv_option_listed(d->options, key, n)) || (w[0] && ckv_option_listed(w[0]->options, key, n)) ||
           (w[1] && ckv_option_listed(w[1]->options, key, n));
}

/* ---- options -------------------------------------------------------------------------------------- */

static ckv_status parse_int(const char *key, const char *v, double lo, double hi, long *out) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: expected an integer, got '%s'", key, v);
    if ((double)x < lo || (double)x > hi)
        return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: %ld is outside [%.0f, %.0f]", key, x, lo, hi);
    *out = x;
    return CKV_STATUS_OK;
}

static ckv_status parse_real(const char *key, const char *v, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x))
        return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: expected a number, got '%s'", key, v);
    if (x < lo || x > hi) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: %g is outside [%g, %g]", key, x, lo, hi);
    *out = x;
    return CKV_STATUS_OK;
}

/* "0.25,0.5,0.75" or "[0.25, 0.5, 0.75]" into x[cap]: at least one number, each in [lo, hi];
 * integers only when `ints` (token ids). *n the count. */
static ckv_status parse_list(const ckv_option_def *o, const char *v, int ints, double *x, int cap, int *n) {
    const char *what = ints ? "token ids" : "numbers", *item = ints ? "id" : "value";
    const char *p = v;
    while (*p == ' ') p++;
    const int bracket = *p == '[';
    if (bracket) p++;
    *n = 0;
    for (;;) {
        char *end = NULL;
        errno = 0;
        const double d = ints ? (double)strtol(p, &end, 10) : strtod(p, &end);
        if (errno || end == p || !isfinite(d))
            return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: expected comma-separated %s, got '%s'", o->key, what, v);
        if (d < o->lo || d > o->hi)
            return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: %s %d (%.15g) is outside [%g, %g]", o->key, item, *n + 1, d,
                             o->lo, o->hi);
        if (*n == cap) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: more than %d %ss", o->key, cap, item);
        x[(*n)++] = d;
        p = end;
        while (*p == ' ') p++;
        if (*p != ',') break;
        p++;
    }
    if (bracket && *p == ']') p++;
    else if (bracket) p = "?";
    if (*p) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: expected comma-separated %s, got '%s'", o->key, what, v);
    return CKV_STATUS_OK;
}

static ckv_status parse_reals(const ckv_option_def *o, const char *v, ckv_press_ratios *out) {
    ckv_press_ratios r;
    CKV_TRY(parse_list(o, v, 0, r.cr, CKV_PRESS_MAX_LAYERS, &r.n));
    *out = r;
    return CKV_STATUS_OK;
}

static ckv_status parse_ids(const ckv_option_def *o, const char *v, ckv_press_ids *out) {
    double x[CKV_PRESS_MAX_IDS];
    ckv_press_ids r;
    CKV_TRY(parse_list(o, v, 1, x, CKV_PRESS_MAX_IDS, &r.n));
    for (int i = 0; i < r.n; i++) r.id[i] = (int32_t)x[i];
    *out = r;
    return CKV_STATUS_OK;
}

/* Value k of a '|'-separated choice list ("" past its end); *len its length. */
static const char *choice_at(const char *choices, int k, int *len) {
    const char *p = choices ? choices : "";
    for (; k > 0 && *p; k--) p = strchr(p, '|') ? strchr(p, '|') + 1 : p + strlen(p);
    const char *end = strchr(p, '|');
    *len = (int)(end ? (size_t)(end - p) : strlen(p));
    return p;
}

static ckv_status option_set(ckv_press_config *c, const ckv_option_def *o, const char *v) {
    char *field = (char *)c + o->offset;
    long i = 0;
    switch (o->type) {
    case CKV_OPTION_INT:
    case CKV_OPTION_BOOL:
        CKV_TRY(parse_int(o->key, v, o->type == CKV_OPTION_BOOL ? 0 : o->lo, o->type == CKV_OPTION_BOOL ? 1 : o->hi, &i));
        if (o->odd && i % 2 == 0) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: %ld must be odd", o->key, i);
        *(int *)field = (int)i;
        return CKV_STATUS_OK;
    case CKV_OPTION_SEED:
        CKV_TRY(parse_int(o->key, v, o->lo, o->hi, &i));
        *(uint64_t *)field = (uint64_t)i;
        return CKV_STATUS_OK;
    case CKV_OPTION_REAL: return parse_real(o->key, v, o->lo, o->hi, (double *)field);
    case CKV_OPTION_CHOICE: {
        int k = 0;
        for (const char *p = o->choices; p && *p; k++) {
            const char *end = strchr(p, '|');
            const size_t len = end ? (size_t)(end - p) : strlen(p);
            if (strlen(v) == len && !strncmp(p, v, len)) {
                *(int *)field = k;
                return CKV_STATUS_OK;
            }
            p = end ? end + 1 : NULL;
        }
        return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: '%s' is not one of %s", o->key, v, o->choices);
    }
    case CKV_OPTION_FILE:
        if (strlen(v) >= sizeof c->profile) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: path too long", o->key);
        strcpy(field, v);
        return CKV_STATUS_OK;
    case CKV_OPTION_REALS: return parse_reals(o, v, (ckv_press_ratios *)field);
    case CKV_OPTION_IDS: return parse_ids(o, v, (ckv_press_ids *)field);
    }
    return ckv_error(CKV_STATUS_ERR_INTERNAL, "press option %s: unknown type", o->key);
}

ckv_status ckv_press_set_option(ckv_press_config *c, const char *key, const char *v) {
    const ckv_option_def *o = ckv_option_def_find(key, strlen(key));
    char buf[512];
    if (!o) return ckv_error(CKV_STATUS_ERR_ARG, "unknown press option '%s' (known: %s)", key, known_options(buf, sizeof buf));
    return option_set(c, o, v);
}

/* Applies "k=v,k=v" (a press's own defaults). */
static ckv_status apply_list(ckv_press_config *c, const char *list) {
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ','), *eq = strchr(p, '=');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        char key[64], value[192];
        if (!eq || eq >= p + n || (size_t)(eq - p) >= sizeof key || n - (size_t)(eq - p) > sizeof value)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "press registry: default '%.*s' is not KEY=VALUE", (int)n, p);
        snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
        snprintf(value, sizeof value, "%.*s", (int)(n - (size_t)(eq - p) - 1), eq + 1);
        CKV_TRY(ckv_press_set_option(c, key, value));
        p = end ? end + 1 : NULL;
    }
    return CKV_STATUS_OK;
}

static void press_defaults(ckv_press_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < ckv_press_option_count; i++) /* the table's defaults are valid by construction */
        if (ckv_press_option_table[i].dflt[0]) option_set(c, &ckv_press_option_table[i], ckv_press_option_table[i].dflt);
}

/* ---- specs ---------------------------------------------------------------------------------------- */

static ckv_status parse_plain(ckv_press_config *c, const char *spec, const char *text);

/* A member that re-rotates or keeps whole chunks after members that all left their rows in position
 * order: kvpress's ScorerPress leaves them in torch.topk's score order, ChunkKVPress and
 * KeyRerotationPress sorted; key_rerotation also needs every member before it to have re-rotated
 * (kvpress rotates a key by its index among those rows, ckv by its stored position: the same then). */
static ckv_status check_member_order(const ckv_press_config *c, const char *spec, int i) {
    int sorted = 1, rerotated = 1;
    for (int j = 0; j < i; j++) {
        sorted &= c->stage_chunk[j] || c->stage_rerotate[j];
        rerotated &= c->stage_rerotate[j];
    }
    if (c->stage_rerotate[i] && !rerotated)
        return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': key_rerotation: on press %d of composed: needs every press "
                         "before it re-rotated too (kvpress's KeyRerotationPress rotates a key by its index among the "
                         "rows the press before left, not by its position)", spec, i + 1);
    if (c->stage_chunk[i] && !sorted)
        return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': chunkkv: on press %d of composed: needs every press before "
                         "it to be chunkkv: or key_rerotation: (kvpress's ChunkKVPress cuts chunks in the order the press "
                         "before left its rows, a plain press's score order; ckv keeps position order)", spec, i + 1);
    return CKV_STATUS_OK;
}

/* composed:P1+P2+...: members joined by '+', each a press that takes the wrapper, optionally wrapped as
 * kvpress's ComposedPress takes it (critical:, chunkkv:, key_rerotation:, key_rerotation:critical:);
 * the later ones read keys and values only (they score the rows the press before kept, whose
 * attention inputs are gone). Options are shared by the members. */
static ckv_status parse_composed(ckv_press_config *c, const char *spec, const char *list) {
    const ckv_wrapper_def *w = ckv_wrapper_def_find("composed", 8);
    c->n_stages = 0;
    for (const char *p = list;;) {
        const char *end = strchr(p, '+');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        char member[256];
        if (c->n_stages == CKV_PRESS_MAX_STAGES)
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': more than %d presses", spec, CKV_PRESS_MAX_STAGES);
        snprintf(member, sizeof member, "%.*s", (int)n, p); /* the spec is shorter than 256 */
        CKV_TRY(parse_plain(c, spec, member));
        const ckv_press_def *d = ckv_press_def_of(c->scorer);
        const int i = c->n_stages;
        if (c->composed)
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': a composed: press inside composed: (write its presses in "
                             "the one list joined by '+': they run in the same order)", spec);
        if (c->alloc != CKV_ALLOC_UNIFORM && c->alloc != CKV_ALLOC_CHUNK && c->alloc != CKV_ALLOC_PER_LAYER)
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': '%s' cannot be composed (%s)", spec, member,
                             c->alloc == CKV_ALLOC_ADAKV ? "kvpress's ComposedPress refuses AdaKVPress"
                             : c->alloc == CKV_ALLOC_HEADKV ? "kvpress has no HeadKV press; its budgets are its own"
                                                            : "its kept counts are its own");
        if (!d || !d->score || !(d->wrappers & CKV_WRAP_COMPOSED))
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': %s cannot be composed (%s)", spec, d ? d->name : member,
                             !d || !d->score ? "it compresses nothing" : "its kept counts are its own");
        if (i > 0 && d->reads != CKV_READS_NONE)
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': %s scores with the attention input, which the rows a press "
                             "before it kept no longer match; after the first press give presses that read keys and "
                             "values only (knorm, keydiff, streaming_llm, random, lagkv, cur)", spec, d->name);
        if (i > 0 && d->scorer == CKV_SCORER_LEVERAGE) /* evict_leverage: one position list for all heads */
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': leverage rotates every head's keys back by one list of "
                             "positions, and the press before it leaves each head its own rows; give it first", spec);
        c->stages[i] = d->scorer;
        c->stage_critical[i] = (unsigned char)(c->critical != 0);
        c->stage_chunk[i] = (unsigned char)(c->alloc == CKV_ALLOC_CHUNK);
        c->stage_rerotate[i] = (unsigned char)(c->rerotate_keys != 0);
        c->stage_per_layer[i] = (unsigned char)(c->alloc == CKV_ALLOC_PER_LAYER);
        c->n_stages++;
        CKV_TRY(check_member_order(c, spec, i));
        if (!end) break;
        p = end + 1;
    }
    c->scorer = c->stages[0];
    c->alloc = w->alloc;
    c->critical = c->stage_critical[0];
    c->rerotate_keys = 0; /* the members re-rotate (ckv_press_stage) */
    c->composed = 1;
    return CKV_STATUS_OK;
}

ckv_status ckv_press_parse(ckv_press_config *c, const char *spec) {
    press_defaults(c);
    char known[1024];
    if (!spec || !*spec) return ckv_error(CKV_STATUS_ERR_ARG, "press: empty press spec (known: %s)", known_presses(known, sizeof known));
    if (strlen(spec) >= 256) return ckv_error(CKV_STATUS_ERR_ARG, "press: spec '%.40s...' is too long", spec);
    if (strchr(spec, '=') || strchr(spec, '('))
        return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': options are not part of the press name; give them as press "
                         "options (KEY=VALUE)", spec);
    return parse_plain(c, spec, spec);
}

/* WRAPPER:critical:PRESS, WRAPPER:PRESS, PRESS or composed:LIST in `text` (all of spec, or one member
 * of a composed list; errors name spec): sets the scorer, allocation and wrappers and applies the
 * press's own defaults. */
static ckv_status parse_plain(ckv_press_config *c, const char *spec, const char *text) {
    char known[1024];
    const char *colon = strchr(text, ':'), *base = colon ? colon + 1 : text;
    const ckv_wrapper_def *w = NULL, *inner = NULL;
    if (colon) {
        const size_t n = (size_t)(colon - text);
        w = ckv_wrapper_def_find(text, n);
        if (!w && ckv_press_def_find(text, n))
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': '%.*s' is a press, not a wrapper; wrappers come first, as "
                             "in critical:snapkv (known: %s)", spec, (int)n, text, known_presses(known, sizeof known));
        if (!w)
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': unknown wrapper '%.*s' (known: %s)", spec, (int)n, text,
                             known_presses(known, sizeof known));
        if (w->composed) {
            if (text != spec) { /* a member of a composed list */
                c->composed = 1;
                return CKV_STATUS_OK;
            }
            return parse_composed(c, spec, base);
        }
        if ((colon = strchr(base, ':'))) { /* a second wrapper: critical:, where kvpress allows it */
            const size_t n2 = (size_t)(colon - base);
            inner = ckv_wrapper_def_find(base, n2);
            if (inner && inner->critical && inner->alloc == CKV_ALLOC_UNIFORM && w->alloc == CKV_ALLOC_CHUNK)
                return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': ckv does not stack chunkkv: on critical: (kvpress "
                                 "allows it, but CriticalKVPress marks its first stage with the largest float, whose "
                                 "chunk sums overflow to inf, so torch's order among tied chunks decides)", spec);
            if (!inner || !w->over_critical || !inner->critical || inner->alloc != CKV_ALLOC_UNIFORM)
                return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': %s: cannot stack on '%.*s' (kvpress's wrappers take "
                                 "a scorer press: key_rerotation: stacks on critical:, a scorer there; nothing stacks "
                                 "on adakv:, critical_adakv:, headkv:, critical_headkv:, and per_layer: needs a press "
                                 "built with compression_ratio, which CriticalKVPress is not)", spec, w->name, (int)n2,
                                 base);
            base = colon + 1;
            if (strchr(base, ':'))
                return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': at most two wrappers (WRAPPER:critical:PRESS)", spec);
        }
    }
    if (strchr(base, '+'))
        return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': presses joined by '+' need the wrapper composed: (as in "
                         "composed:snapkv+knorm)", spec);
    const ckv_press_def *d = ckv_press_def_find(base, strlen(base));
    if (!d)
        return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': unknown press '%s' (known: %s)", spec, base,
                         known_presses(known, sizeof known));
    for (int k = 0; k < 2; k++) {
        const ckv_wrapper_def *wk = k ? inner : w;
        if (wk && (d->wrappers & wk->needs) != wk->needs)
            return ckv_error(CKV_STATUS_ERR_ARG, "press '%s': %s cannot be wrapped by %s (%s)", spec, base, wk->name,
                             d->kept != CKV_KEPT_UNIFORM ? "its kept counts are its own"
                             : wk->needs & CKV_WRAP_CHUNKKV ? "chunks are ranked by score values, which this press does not give"
                                                            : "the wrapper does not take it");
    }
    c->scorer = d->scorer;
    c->alloc = w ? w->alloc : d->alloc;
    c->critical = w ? w->critical || inner : 0;
    c->rerotate_keys = w ? w->rerotate : 0;
    return apply_list(c, d->defaults);
}

/* ---- budget --------------------------------------------------------------------------------------- */

ckv_status ckv_press_set_budget(ckv_press_config *c, double b) {
    if (!(b > 0.0 && b <= 1.0)) return ckv_error(CKV_STATUS_ERR_ARG, "budget %g is outside (0, 1] (the kept fraction)", b);
    c->compression_ratio = 1.0 - b;
    c->budget_given_as_b = 1;
    c->budget_tokens = 0;
    return CKV_STATUS_OK;
}

ckv_status ckv_press_set_compression_ratio(ckv_press_config *c, double cr) {
    if (!(cr >= 0.0 && cr < 1.0))
        return ckv_error(CKV_STATUS_ERR_ARG, "compression_ratio %g is outside [0, 1) (the fraction removed)", cr);
    c->compression_ratio = cr;
    c->budget_given_as_b = 0;
    c->budget_tokens = 0;
    return CKV_STATUS_OK;
}

ckv_status ckv_press_set_budget_tokens(ckv_press_config *c, int n) {
    if (n < 1) return ckv_error(CKV_STATUS_ERR_ARG, "budget_tokens %d must be >= 1", n);
    c->budget_tokens = n;
    c->compression_ratio = 0.0;
    c->budget_given_as_b = 0;
    return CKV_STATUS_OK;
}

static ckv_status set_budget(ckv_press_config *c, const ckv_press_budget *b) {
    switch (b->kind) {
    case CKV_BUDGET_NONE: return CKV_STATUS_OK;
    case CKV_BUDGET_FRACTION: return ckv_press_set_budget(c, b->value);
    case CKV_BUDGET_RATIO: return ckv_press_set_compression_ratio(c, b->value);
    case CKV_BUDGET_TOKENS:
        if (!(b->value == floor(b->value) && b->value <= 2147483647.0))
            return ckv_error(CKV_STATUS_ERR_ARG, "budget_tokens %g must be an integer", b->value);
        return ckv_press_set_budget_tokens(c, b->value < 0 ? 0 : (int)b->value);
    }
    return ckv_error(CKV_STATUS_ERR_ARG, "budget: unknown kind %d", (int)b->kind);
}

static const char *budget_field(ckv_budget_kind k) {
    return k == CKV_BUDGET_RATIO ? "compression_ratio" : k == CKV_BUDGET_TOKENS ? "budget_tokens" : "budget";
}

/* ---- canonical spec ------------------------------------------------------------------------------- */

static int print_options(char *buf, size_t cap, const ckv_press_config *c, const char *keys) {
    int n = 0;
    for (const char *p = keys; p && *p && (size_t)n < cap;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        const ckv_option_def *o = ckv_option_def_find(p, len);
        const char *field = (const char *)c + (o ? o->offset : 0);
        const char *sep = p == keys ? "" : ",";
        if (o) switch (o->type) {
            case CKV_OPTION_INT:
            case CKV_OPTION_BOOL: n += snprintf(buf + n, cap - (size_t)n, "%s%s=%d", sep, o->key, *(const int *)field); break;
            case CKV_OPTION_REAL: n += snprintf(buf + n, cap - (size_t)n, "%s%s=%g", sep, o->key, *(const double *)field); break;
            case CKV_OPTION_SEED:
                n += snprintf(buf + n, cap - (size_t)n, "%s%s=%llu", sep, o->key, (unsigned long long)*(const uint64_t *)field);
                break;
            case CKV_OPTION_CHOICE: {
                int vlen = 0;
                const char *v = choice_at(o->choices, *(const int *)field, &vlen);
                n += snprintf(buf + n, cap - (size_t)n, "%s%s=%.*s", sep, o->key, vlen, v);
                break;
            }
            case CKV_OPTION_FILE: n += snprintf(buf + n, cap - (size_t)n, "%s%s=%s", sep, o->key, field); break;
            case CKV_OPTION_REALS: {
                const ckv_press_ratios *r = (const ckv_press_ratios *)field;
                n += snprintf(buf + n, cap - (size_t)n, "%s%s=[", sep, o->key);
                for (int i = 0; i < r->n && (size_t)n < cap; i++)
                    n += snprintf(buf + n, cap - (size_t)n, "%s%g", i ? "," : "", r->cr[i]);
                if ((size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "]");
                break;
            }
            case CKV_OPTION_IDS: {
                const ckv_press_ids *r = (const ckv_press_ids *)field;
                n += snprintf(buf + n, cap - (size_t)n, "%s%s=[", sep, o->key);
                for (int i = 0; i < r->n && (size_t)n < cap; i++)
                    n += snprintf(buf + n, cap - (size_t)n, "%s%d", i ? "," : "", (int)r->id[i]);
                if ((size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "]");
                break;
            }
            }
        p = end ? end + 1 : NULL;
    }
    return n;
}

/* composed: press_ratios gives one ratio per member but the per_layer: ones, which take the shared
 * compression_ratios (kvpress's PerLayerCompressionPress has no compression_ratio to set). On an
 * error, *field names the option and *missing says it was not given. */
static ckv_status check_composed_ratios(const ckv_press_config *c, const char *name, const char **field, int *missing) {
    const int want = ckv_press_n_ratios(c), n_per_layer = c->n_stages - want;
    const char *f = "press_ratios";
    int absent = 0;
    ckv_status st = CKV_STATUS_OK;
    if (n_per_layer > 0 && c->layer_ratios.n < 1) {
        f = "compression_ratios";
        absent = 1;
        st = ckv_error(CKV_STATUS_ERR_ARG, "press %s needs option compression_ratios for its per_layer: member (one "
                       "ratio per layer of the model, e.g. compression_ratios=0.25,0.5,0.75)", name);
    } else if (want > 0 && c->press_ratios.n < 1) {
        absent = 1;
        st = ckv_error(CKV_STATUS_ERR_ARG, "press %s needs option press_ratios (one compression ratio per press%s, in "
                       "order, e.g. press_ratios=0.5,0.25)", name, n_per_layer ? " but its per_layer: members" : "");
    } else if (c->press_ratios.n != want) {
        st = n_per_layer ? ckv_error(CKV_STATUS_ERR_ARG, "press %s: press_ratios has %d values for %d presses that take "
                                     "one (per_layer: members take their ratios from compression_ratios, not "
                                     "press_ratios)", name, c->press_ratios.n, want)
                         : ckv_error(CKV_STATUS_ERR_ARG, "press %s: press_ratios has %d values for %d presses", name,
                                     c->press_ratios.n, want);
    }
    if (st != CKV_STATUS_OK && field) *field = f;
    if (st != CKV_STATUS_OK && missing) *missing = absent;
    return st;
}

/* The wrappers of c, outermost first, with their options: "per_layer(...):critical(...):"; the length. */
static int print_wrappers(char *buf, size_t cap, const ckv_press_config *c) {
    const ckv_wrapper_def *ws[2];
    wrappers_of(c, ws);
    int n = 0;
    buf[0] = '\0';
    for (int k = 0; k < 2 && ws[k] && (size_t)n < cap; k++) {
        if (!ws[k]->options[0] || (ws[k]->composed && ckv_press_n_ratios(c) == 0)) { /* composed: of per_layer: only */
            n += snprintf(buf + n, cap - (size_t)n, "%s:", ws[k]->name);
            continue;
        }
        n += snprintf(buf + n, cap - (size_t)n, "%s(", ws[k]->name);
        if ((size_t)n < cap) n += print_options(buf + n, cap - (size_t)n, c, ws[k]->options);
        if ((size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "):");
    }
    return n;
}

ckv_status ckv_press_finalize(ckv_press_config *c) {
    const ckv_press_def *d = ckv_press_def_of(c->scorer);
    if (!d) return ckv_error(CKV_STATUS_ERR_ARG, "press: unknown scorer kind %d", (int)c->scorer);
    if (!ckv_press_evicts(c) && (c->compression_ratio > 0 || c->budget_tokens > 0))
        return ckv_error(CKV_STATUS_ERR_ARG, "a budget was given but the press is none (the full cache)");
    if (c->alloc == CKV_ALLOC_PER_LAYER && c->layer_ratios.n < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "press per_layer needs option compression_ratios (one ratio per layer of the "
                         "model, e.g. compression_ratios=0.25,0.5,0.75)");
    if (c->composed) CKV_TRY(check_composed_ratios(c, "composed", NULL, NULL));
    if (c->alloc == CKV_ALLOC_CHUNK && c->chunk_length < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "press chunkkv: chunk_length %d must be at least 1", c->chunk_length);
    if (c->scorer == CKV_SCORER_FINCH && c->chunk_length > 0 && c->budget_tokens > 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "press finch with chunk_length counts its budget per chunk: give budget or "
                         "compression_ratio, not budget_tokens");
    if (c->alloc == CKV_ALLOC_CHUNK && c->budget_tokens > 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "press chunkkv keeps whole chunks: give budget or compression_ratio, not "
                         "budget_tokens");
    char wrap[2600] = "", base[600] = "", budget[200] = "";
    print_wrappers(wrap, sizeof wrap, c);
    int n = 0;
    for (int i = 0; i < (c->composed ? c->n_stages : 1) && (size_t)n < sizeof base; i++) { /* composed: P1+P2+... */
        const ckv_press_def *di = i ? ckv_press_def_of(c->stages[i]) : d;
        n += snprintf(base + n, sizeof base - (size_t)n, "%s", i ? "+" : "");
        if (c->composed && (size_t)n < sizeof base) { /* the member's own wrappers */
            ckv_press_config sc;
            ckv_press_stage(c, i, &sc);
            n += print_wrappers(base + n, sizeof base - (size_t)n, &sc);
        }
        if ((size_t)n < sizeof base) n += snprintf(base + n, sizeof base - (size_t)n, "%s", di ? di->name : "?");
        if (di && di->options[0] && (size_t)n < sizeof base) {
            n += snprintf(base + n, sizeof base - (size_t)n, "(");
            n += print_options(base + n, sizeof base - (size_t)n, c, di->options);
            if ((size_t)n < sizeof base) n += snprintf(base + n, sizeof base - (size_t)n, ")");
        }
    }
    /* the kept-count formula (a press that selects over the model states its model-wide total) */
    const char *formula = d->kept == CKV_KEPT_MODEL_FRACTION ? "kept=int(L*(1-cr)*Hkv*n_layers) over the model"
                          : d->kept == CKV_KEPT_MODEL_REMOVED
                              ? (c->layerwise ? "removed=int(Hkv*L*cr) per layer" : "removed=int(n_layers*Hkv*L*cr) over the model")
                          : d->kept == CKV_KEPT_CHUNKS && c->chunk_length > 0
                              ? "kept=sum over chunks of chunk_length rows of max(1,floor(len*(1-cr)))"
                              : "kept=max(1,floor(L*(1-cr)))";
    double kept_share = 1.0, layer_mean = 0.0; /* composed: the fraction the presses keep together, as kvpress's
                                                * ComposedPress reports it (a per_layer: member at its mean ratio) */
    for (int l = 0; l < c->layer_ratios.n; l++) layer_mean += c->layer_ratios.cr[l] / c->layer_ratios.n;
    for (int i = 0; c->composed && i < c->n_stages; i++) {
        ckv_press_config sc;
        ckv_press_stage(c, i, &sc);
        kept_share *= 1.0 - (c->stage_per_layer[i] ? layer_mean : sc.compression_ratio);
    }
    if (!ckv_press_evicts(c))
        snprintf(budget, sizeof budget, " full cache");
    else if (c->composed)
        snprintf(budget, sizeof budget, " per press (kept=max(1,floor(n*(1-cr_i))) of the n rows before it%s; "
                 "cr=%.6g overall)", ckv_press_n_ratios(c) < c->n_stages ? ", a per_layer: press's cr_i its layer's" : "",
                 1.0 - kept_share);
    else if (c->alloc == CKV_ALLOC_PER_LAYER)
        snprintf(budget, sizeof budget, " per layer (kept=max(1,floor(L*(1-cr_layer))))");
    else if (c->budget_tokens > 0)
        snprintf(budget, sizeof budget, " budget_tokens=%d per head%s", c->budget_tokens,
                 d->kept == CKV_KEPT_MODEL_FRACTION || d->kept == CKV_KEPT_MODEL_REMOVED ? " (n_layers*Hkv*N over the model)" : "");
    else if (c->budget_given_as_b)
        snprintf(budget, sizeof budget, " budget=%g (cr=%.17g, %s)", 1.0 - c->compression_ratio, c->compression_ratio,
                 formula);
    else
        snprintf(budget, sizeof budget, " cr=%g (%s)", c->compression_ratio, formula);
    char question[48] = ""; /* finch: the window it was given (ckv_press_with_question) */
    if (c->scorer == CKV_SCORER_FINCH && c->question_rows > 0)
        snprintf(question, sizeof question, " question_rows=%d", c->question_rows);
    const int len = snprintf(c->spec, sizeof c->spec, "%s%s%s%s%s", wrap, base, question, budget,
                             c->query_aware ? " query-aware" : " context-only");
    if (len < 0 || (size_t)len >= sizeof c->spec || strlen(wrap) + 1 >= sizeof wrap || (size_t)n >= sizeof base)
        return ckv_error(CKV_STATUS_ERR_ARG, "press: its canonical spec is longer than %zu characters (write "
                         "compression_ratios with fewer digits)", sizeof c->spec - 1);
    return CKV_STATUS_OK;
}

/* ---- the builder ---------------------------------------------------------------------------------- */

static ckv_status fail(ckv_press_config *out, ckv_press_error *err, const char *field, int missing, ckv_status st) {
    if (err) {
        err->field = field;
        err->missing = missing;
    }
    press_defaults(out); /* a valid full-cache press; the error message stays */
    snprintf(out->spec, sizeof out->spec, "none full cache context-only");
    return st;
}

ckv_status ckv_press_build(ckv_press_config *out, const ckv_press_request *rq, ckv_press_error *err) {
    if (err) err->field = NULL, err->missing = 0, err->option = 0;
    if (!out || !rq) return ckv_error(CKV_STATUS_ERR_ARG, "ckv_press_build: no press or request");
    const ckv_press_config *def = rq->defaults;
    ckv_status st = CKV_STATUS_OK;
    if (rq->spec) {
        if ((st = ckv_press_parse(out, rq->spec)) != CKV_STATUS_OK) return fail(out, err, "press", 0, st);
        if (def && ckv_press_evicts(def) && rq->budget.kind == CKV_BUDGET_NONE && out->alloc != CKV_ALLOC_PER_LAYER &&
            !out->composed) {
            /* the defaults' budget */
            out->compression_ratio = def->compression_ratio;
            out->budget_tokens = def->budget_tokens;
            out->budget_given_as_b = def->budget_given_as_b;
        }
    } else if (def) {
        *out = *def;
    } else {
        press_defaults(out);
    }
    for (int i = 0; i < rq->n_options; i++) {
        const ckv_press_option_value *o = &rq->options[i];
        const ckv_option_def *od = o->key ? ckv_option_def_find(o->key, strlen(o->key)) : NULL;
        if (err) err->option = 1;
        if (od && od->type == CKV_OPTION_FILE && (rq->flags & CKV_PRESS_NO_FILE_OPTIONS)) {
            st = ckv_error(CKV_STATUS_ERR_ARG, "press option %s names a file, which only the server's own press options "
                           "may do", od->key);
            return fail(out, err, od->key, 0, st);
        }
        if ((st = ckv_press_set_option(out, o->key ? o->key : "", o->value ? o->value : "")) != CKV_STATUS_OK)
            return fail(out, err, od ? od->key : "press", 0, st);
        if (!(rq->flags & CKV_PRESS_ANY_OPTIONS) && !ckv_press_takes(out, o->key)) {
            ckv_press_finalize(out);
            st = ckv_error(CKV_STATUS_ERR_ARG, "press %s does not take option %s (its options are those its spec lists: "
                           "%s)", rq->spec ? rq->spec : ckv_scorer_name(out->scorer), o->key, out->spec);
            return fail(out, err, od->key, 0, st);
        }
        if (err) err->option = 0;
    }
    if ((st = set_budget(out, &rq->budget)) != CKV_STATUS_OK) return fail(out, err, budget_field(rq->budget.kind), 0, st);
    if (rq->query_aware >= 0) out->query_aware = rq->query_aware != 0;
    const char *name = rq->spec ? rq->spec : ckv_scorer_name(out->scorer);
    if (out->alloc == CKV_ALLOC_PER_LAYER) { /* its ratios are its budget */
        if (rq->budget.kind != CKV_BUDGET_NONE) {
            st = ckv_error(CKV_STATUS_ERR_ARG, "press %s takes its budget from compression_ratios (one per layer); give no "
                           "%s", name, budget_field(rq->budget.kind));
            return fail(out, err, budget_field(rq->budget.kind), 0, st);
        }
        if (out->layer_ratios.n < 1) {
            st = ckv_error(CKV_STATUS_ERR_ARG, "press %s needs option compression_ratios (one ratio per layer of the model, "
                           "e.g. compression_ratios=0.25,0.5,0.75)", name);
            return fail(out, err, "compression_ratios", 1, st);
        }
    } else if (out->composed) { /* so are composed's, one per press */
        if (rq->budget.kind != CKV_BUDGET_NONE) {
            st = ckv_error(CKV_STATUS_ERR_ARG, "press %s takes its budget from press_ratios (one compression ratio per "
                           "press); give no %s", name, budget_field(rq->budget.kind));
            return fail(out, err, budget_field(rq->budget.kind), 0, st);
        }
        const char *field = NULL;
        int missing = 0;
        if ((st = check_composed_ratios(out, name, &field, &missing)) != CKV_STATUS_OK)
            return fail(out, err, field, missing, st);
    } else if ((rq->flags & CKV_PRESS_NEED_BUDGET) && ckv_press_evicts(out) && rq->budget.kind == CKV_BUDGET_NONE &&
        out->compression_ratio == 0.0 && out->budget_tokens == 0) {
        st = ckv_error(CKV_STATUS_ERR_ARG, "press %s needs a budget (budget, compression_ratio or budget_tokens)", name);
        return fail(out, err, "budget", 1, st);
    }
    if (rq->flags & CKV_PRESS_NEED_FILES)
        for (int i = 0; i < ckv_press_option_count; i++) {
            const ckv_option_def *o = &ckv_press_option_table[i];
            if (o->type == CKV_OPTION_FILE && ckv_press_takes(out, o->key) && !((const char *)out + o->offset)[0]) {
                st = ckv_error(CKV_STATUS_ERR_ARG, "press %s needs option %s (%s)", name, o->key, o->what);
                return fail(out, err, o->key, 1, st);
            }
        }
    for (int i = 0; i < ckv_press_option_count; i++) { /* token-id options have no default: required when taken */
        const ckv_option_def *o = &ckv_press_option_table[i];
        if (o->type == CKV_OPTION_IDS && ckv_press_takes(out, o->key) &&
            ((const ckv_press_ids *)((const char *)out + o->offset))->n < 1) {
            st = ckv_error(CKV_STATUS_ERR_ARG, "press %s needs option %s (%s)", name, o->key, o->what);
            return fail(out, err, o->key, 1, st);
        }
    }
    if (!ckv_press_evicts(out) && (out->compression_ratio > 0 || out->budget_tokens > 0)) {
        st = ckv_error(CKV_STATUS_ERR_ARG, "a budget was given but the press is none (the full cache)");
        return fail(out, err, budget_field(rq->budget.kind), 0, st);
    }
    if ((st = ckv_press_finalize(out)) != CKV_STATUS_OK) return fail(out, err, "press", 0, st);
    return CKV_STATUS_OK;
}
