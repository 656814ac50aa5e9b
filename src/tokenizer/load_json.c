/* load_json.c - reads a Hugging Face tokenizer.json (and tokenizer_config.json beside it) into
 * ckv_tokenizer: model BPE (vocab, merges as "a b" strings or [a, b] pairs, byte_fallback,
 * fuse_unk, ignore_merges, unk_token, affixes), added_tokens, normalizer, pre_tokenizer,
 * post_processor (TemplateProcessing, ByteLevel, Bert/Roberta, Sequence) and decoder. Anything else
 * is refused with an error naming the file and the unsupported type; malformed input (wrong JSON
 * types, ids out of range, merges naming unknown tokens) is refused the same way, never trusted.
 * It does not encode or decode. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json.h"
#include "tokenizer/tok_internal.h"

#define MAX_VOCAB (1 << 21) /* ids beyond this are refused (real vocabularies stay under 2^18) */

static const char k_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    ckv_tokenizer *t;
    const char *what;
} ld;

static int opt_bool(const ckv_json *o, const char *key, int dflt) {
    const ckv_json *v = ckv_json_get(o, key);
    return ckv_json_is_bool(v) ? ckv_json_bool(v) : dflt;
}

static ckv_status get_id(const ld *L, const ckv_json *v, const char *ctx, int32_t *out) {
    *out = -1;
    if (!ckv_json_is_number(v))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s: expected an integer token id", L->what, ctx);
    double d = ckv_json_number(v);
    if (!(d >= 0 && d < MAX_VOCAB) || d != (double)(int32_t)d)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s: token id %.17g is not an integer in [0, %d)", L->what, ctx, d,
                         MAX_VOCAB);
    *out = (int32_t)d;
    return CKV_STATUS_OK;
}

static const char *type_of(const ckv_json *o) {
    const char *s = ckv_json_string(ckv_json_get(o, "type"));
    return s ? s : "";
}

static ckv_status dup_str(const ld *L, const char *s, char **out, size_t *len) {
    size_t n = strlen(s);
    size_t bad = ckv_utf8_first_invalid((const uint8_t *)s, n);
    if (bad < n)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: string '%.40s' is not valid UTF-8 (byte 0x%02x at offset %zu)",
                         L->what, s, (uint8_t)s[bad], bad);
    *out = malloc(n + 1);
    if (!*out) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", L->what);
    memcpy(*out, s, n + 1);
    if (len) *len = n;
    return CKV_STATUS_OK;
}

/* {"String": "x"} or {"Regex": "..."} */
static ckv_status get_pattern(const ld *L, const ckv_json *pat, const char *ctx, char **lit, size_t *lit_len,
                              pcre2_code **re) {
    *lit = NULL;
    *re = NULL;
    const char *s = ckv_json_string(ckv_json_get(pat, "String"));
    if (s) return dup_str(L, s, lit, lit_len);
    const char *r = ckv_json_string(ckv_json_get(pat, "Regex"));
    if (r) {
        char what[300];
        snprintf(what, sizeof what, "%s: %s", L->what, ctx);
        return ckv_tk_regex_compile(re, r, strlen(r), what);
    }
    return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s: pattern must be {\"String\": ...} or {\"Regex\": ...}", L->what, ctx);
}

/* ---- normalizer ------------------------------------------------------------------------------- */

static ckv_status add_norm(const ld *L, ckv_tk_norm n) {
    ckv_tokenizer *t = L->t;
    ckv_tk_norm *p = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *p);
    if (!p) {
        ckv_tk_norm_free(&n);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", L->what);
    }
    t->norms = p;
    t->norms[t->n_norms++] = n;
    return CKV_STATUS_OK;
}

static ckv_status parse_normalizer(const ld *L, const ckv_json *o, int depth) {
    if (ckv_json_is_null(o)) return CKV_STATUS_OK;
    if (!ckv_json_is_object(o) || depth > 8)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: normalizer must be an object or null", L->what);
    const char *ty = type_of(o);
    ckv_tk_norm n;
    memset(&n, 0, sizeof n);
    if (!strcmp(ty, "Sequence")) {
        const ckv_json *arr = ckv_json_get(o, "normalizers");
        if (!ckv_json_is_array(arr))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: normalizer Sequence without a 'normalizers' array", L->what);
        for (int i = 0; i < ckv_json_array_size(arr); i++) CKV_TRY(parse_normalizer(L, ckv_json_array_at(arr, i), depth + 1));
        return CKV_STATUS_OK;
    }
    if (!strcmp(ty, "NFC")) n.kind = CKV_TK_NORM_NFC;
    else if (!strcmp(ty, "NFD")) n.kind = CKV_TK_NORM_NFD;
    else if (!strcmp(ty, "NFKC")) n.kind = CKV_TK_NORM_NFKC;
    else if (!strcmp(ty, "NFKD")) n.kind = CKV_TK_NORM_NFKD;
    else if (!strcmp(ty, "Prepend")) {
        const char *s = ckv_json_string(ckv_json_get(o, "prepend"));
        if (!s) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: normalizer Prepend without a 'prepend' string", L->what);
        n.kind = CKV_TK_NORM_PREPEND;
        CKV_TRY(dup_str(L, s, &n.a, &n.a_len));
    } else if (!strcmp(ty, "Replace")) {
        const char *c = ckv_json_string(ckv_json_get(o, "content"));
        if (!c) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: normalizer Replace without a 'content' string", L->what);
        n.kind = CKV_TK_NORM_REPLACE;
        ckv_status s = get_pattern(L, ckv_json_get(o, "pattern"), "normalizer Replace", &n.a, &n.a_len, &n.re);
        if (s == CKV_STATUS_OK) s = dup_str(L, c, &n.b, &n.b_len);
        if (s != CKV_STATUS_OK) {
            ckv_tk_norm_free(&n);
            return s;
        }
    } else if (!strcmp(ty, "Strip")) {
        n.kind = CKV_TK_NORM_STRIP;
        n.left = opt_bool(o, "strip_left", 1);
        n.right = opt_bool(o, "strip_right", 1);
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: normalizer type '%s' is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, "
                         "Strip, Sequence)",
                         L->what, ty);
    }
    return add_norm(L, n);
}

/* ---- pre-tokenizer ---------------------------------------------------------------------------- */

static ckv_status add_pre(const ld *L, ckv_tk_pre p) {
    ckv_tokenizer *t = L->t;
    ckv_tk_pre *q = realloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *q);
    if (!q) {
        ckv_tk_pre_free(&p);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", L->what);
    }
    t->pres = q;
    t->pres[t->n_pres++] = p;
    return CKV_STATUS_OK;
}

static int parse_scheme(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "always")) return CKV_TK_PREPEND_ALWAYS;
    if (!strcmp(s, "first")) return CKV_TK_PREPEND_FIRST;
    if (!strcmp(s, "never")) return CKV_TK_PREPEND_NEVER;
    return -1;
}

static ckv_status metaspace_fields(const ld *L, const ckv_json *o, const char *ctx, char *repl, int *repl_len,
                                   int *scheme) {
    const char *r = ckv_json_string(ckv_json_get(o, "replacement"));
    int valid = r ? ckv_utf8_valid_len((const uint8_t *)r, strlen(r)) : 0;
    if (!r || valid <= 0 || (size_t)valid != strlen(r))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s: 'replacement' must be one character", L->what, ctx);
    memcpy(repl, r, (size_t)valid);
    *repl_len = valid;
    const ckv_json *ps = ckv_json_get(o, "prepend_scheme");
    *scheme = CKV_TK_PREPEND_ALWAYS;
    if (!ckv_json_is_null(ps)) {
        *scheme = parse_scheme(ckv_json_string(ps));
        if (*scheme < 0)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s: prepend_scheme must be always, first or never", L->what, ctx);
    }
    const ckv_json *aps = ckv_json_get(o, "add_prefix_space");
    if (ckv_json_is_bool(aps) && !ckv_json_bool(aps)) *scheme = CKV_TK_PREPEND_NEVER;
    return CKV_STATUS_OK;
}

static ckv_status parse_pre(const ld *L, const ckv_json *o, int depth) {
    if (ckv_json_is_null(o)) return CKV_STATUS_OK;
    if (!ckv_json_is_object(o) || depth > 8)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: pre_tokenizer must be an object or null", L->what);
    const char *ty = type_of(o);
    ckv_tk_pre p;
    memset(&p, 0, sizeof p);
    if (!strcmp(ty, "Sequence")) {
        const ckv_json *arr = ckv_json_get(o, "pretokenizers");
        if (!ckv_json_is_array(arr))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: pre_tokenizer Sequence without a 'pretokenizers' array", L->what);
        for (int i = 0; i < ckv_json_array_size(arr); i++) CKV_TRY(parse_pre(L, ckv_json_array_at(arr, i), depth + 1));
        return CKV_STATUS_OK;
    }
    if (!strcmp(ty, "Split")) {
        static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        static const ckv_tk_split_behavior vals[] = {CKV_TK_SPLIT_ISOLATED, CKV_TK_SPLIT_REMOVED,
                                                     CKV_TK_SPLIT_MERGED_WITH_PREVIOUS, CKV_TK_SPLIT_MERGED_WITH_NEXT,
                                                     CKV_TK_SPLIT_CONTIGUOUS};
        const char *b = ckv_json_string(ckv_json_get(o, "behavior"));
        int found = 0;
        for (int i = 0; b && i < 5; i++)
            if (!strcmp(b, names[i])) {
                p.behavior = vals[i];
                found = 1;
            }
        if (!found)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: pre_tokenizer Split: behavior '%s' is not one of Isolated, "
                             "Removed, MergedWithPrevious, MergedWithNext, Contiguous", L->what, b ? b : "(missing)");
        p.kind = CKV_TK_PRE_SPLIT;
        p.invert = opt_bool(o, "invert", 0);
        CKV_TRY(get_pattern(L, ckv_json_get(o, "pattern"), "pre_tokenizer Split", &p.lit, &p.lit_len, &p.re));
    } else if (!strcmp(ty, "ByteLevel")) {
        p.kind = CKV_TK_PRE_BYTELEVEL;
        p.add_prefix_space = opt_bool(o, "add_prefix_space", 1);
        if (opt_bool(o, "use_regex", 1)) {
            char what[300];
            snprintf(what, sizeof what, "%s: ByteLevel", L->what);
            CKV_TRY(ckv_tk_regex_compile(&p.re, k_gpt2_regex, strlen(k_gpt2_regex), what));
        }
    } else if (!strcmp(ty, "Digits")) {
        p.kind = CKV_TK_PRE_DIGITS;
        p.individual = opt_bool(o, "individual_digits", 0);
    } else if (!strcmp(ty, "Metaspace")) {
        p.kind = CKV_TK_PRE_METASPACE;
        CKV_TRY(metaspace_fields(L, o, "pre_tokenizer Metaspace", p.repl, &p.repl_len, &p.prepend_scheme));
        p.split = opt_bool(o, "split", 1);
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer type '%s' is not supported (supported: Split, ByteLevel, Digits, Metaspace, "
                         "Sequence)",
                         L->what, ty);
    }
    return add_pre(L, p);
}

/* ---- post-processor --------------------------------------------------------------------------- */

static ckv_status push_post(const ld *L, int after, int32_t id) {
    ckv_tokenizer *t = L->t;
    int32_t **arr = after ? &t->post_post : &t->post_pre;
    int *n = after ? &t->n_post_post : &t->n_post_pre;
    if (*n >= 64) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: post_processor adds more than 64 tokens", L->what);
    int32_t *p = realloc(*arr, (size_t)(*n + 1) * sizeof *p);
    if (!p) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", L->what);
    *arr = p;
    p[(*n)++] = id;
    return CKV_STATUS_OK;
}

static ckv_status parse_post(const ld *L, const ckv_json *o, int depth) {
    if (ckv_json_is_null(o)) return CKV_STATUS_OK;
    if (!ckv_json_is_object(o) || depth > 8)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: post_processor must be an object or null", L->what);
    const char *ty = type_of(o);
    if (!strcmp(ty, "Sequence")) {
        const ckv_json *arr = ckv_json_get(o, "processors");
        if (!ckv_json_is_array(arr))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: post_processor Sequence without a 'processors' array", L->what);
        for (int i = 0; i < ckv_json_array_size(arr); i++) CKV_TRY(parse_post(L, ckv_json_array_at(arr, i), depth + 1));
        return CKV_STATUS_OK;
    }
    if (!strcmp(ty, "ByteLevel")) return CKV_STATUS_OK; /* offsets only */
    if (!strcmp(ty, "TemplateProcessing")) {
        const ckv_json *single = ckv_json_get(o, "single");
        const ckv_json *specials = ckv_json_get(o, "special_tokens");
        if (!ckv_json_is_array(single))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: TemplateProcessing without a 'single' array", L->what);
        int after = 0, seen_seq = 0;
        for (int i = 0; i < ckv_json_array_size(single); i++) {
            const ckv_json *item = ckv_json_array_at(single, i);
            const ckv_json *sp = ckv_json_get(item, "SpecialToken");
            if (ckv_json_get(item, "Sequence")) {
                if (seen_seq)
                    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: TemplateProcessing 'single' repeats the sequence",
                                     L->what);
                seen_seq = after = 1;
                continue;
            }
            const char *name = ckv_json_string(ckv_json_get(sp, "id"));
            if (!name)
                return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: TemplateProcessing item %d is neither SpecialToken nor "
                                 "Sequence", L->what, i);
            const ckv_json *ent = ckv_json_get(specials, name);
            const ckv_json *ids = ckv_json_get(ent, "ids");
            if (!ckv_json_is_array(ids))
                return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: TemplateProcessing special token '%s' has no 'ids'", L->what,
                                 name);
            for (int k = 0; k < ckv_json_array_size(ids); k++) {
                int32_t id = -1;
                CKV_TRY(get_id(L, ckv_json_array_at(ids, k), "TemplateProcessing ids", &id));
                CKV_TRY(push_post(L, after, id));
            }
        }
        return CKV_STATUS_OK;
    }
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
        const ckv_json *cls = ckv_json_get(o, "cls"), *sep = ckv_json_get(o, "sep");
        int32_t c = -1, s = -1;
        if (!ckv_json_is_array(cls) || !ckv_json_is_array(sep))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s needs 'cls' and 'sep' pairs", L->what, ty);
        CKV_TRY(get_id(L, ckv_json_array_at(cls, 1), "post_processor cls", &c));
        CKV_TRY(get_id(L, ckv_json_array_at(sep, 1), "post_processor sep", &s));
        CKV_TRY(push_post(L, 0, c));
        return push_post(L, 1, s);
    }
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                     "%s: post_processor type '%s' is not supported (supported: TemplateProcessing, ByteLevel, "
                     "BertProcessing, RobertaProcessing, Sequence)",
                     L->what, ty);
}

/* ---- decoder ---------------------------------------------------------------------------------- */

static ckv_status parse_decoder(const ld *L, const ckv_json *o) {
    ckv_tk_decoder *d = &L->t->dec;
    memset(d, 0, sizeof *d);
    if (ckv_json_is_null(o)) {
        d->mode = CKV_TK_DEC_NONE;
        return CKV_STATUS_OK;
    }
    if (!ckv_json_is_object(o)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: decoder must be an object or null", L->what);
    const char *ty = type_of(o);
    const ckv_json *steps = NULL;
    int n = 1;
    if (!strcmp(ty, "Sequence")) {
        steps = ckv_json_get(o, "decoders");
        if (!ckv_json_is_array(steps))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: decoder Sequence without a 'decoders' array", L->what);
        n = ckv_json_array_size(steps);
    }
    int stage = 0; /* SPM steps must come in the order Replace, ByteFallback, Fuse, Strip */
    int fuse = 0;
    d->mode = CKV_TK_DEC_NONE;
    for (int i = 0; i < n; i++) {
        const ckv_json *s = steps ? ckv_json_array_at(steps, i) : o;
        const char *st = type_of(s);
        int lone = n == 1;
        if (!strcmp(st, "ByteLevel") && lone) {
            d->mode = CKV_TK_DEC_BYTELEVEL;
        } else if (!strcmp(st, "Metaspace") && lone) {
            d->mode = CKV_TK_DEC_METASPACE;
            CKV_TRY(metaspace_fields(L, s, "decoder Metaspace", d->repl, &d->repl_len, &d->prepend_scheme));
        } else if (!strcmp(st, "Replace") && stage < 1) {
            const ckv_json *pat = ckv_json_get(s, "pattern");
            const char *from = ckv_json_string(ckv_json_get(pat, "String"));
            const char *to = ckv_json_string(ckv_json_get(s, "content"));
            if (!from || !to || strlen(from) >= sizeof d->rep_from || strlen(to) >= sizeof d->rep_to ||
                ckv_utf8_first_invalid((const uint8_t *)from, strlen(from)) != strlen(from) ||
                ckv_utf8_first_invalid((const uint8_t *)to, strlen(to)) != strlen(to))
                return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: decoder Replace must map a short literal String to a "
                                 "short 'content'", L->what);
            d->replace = 1;
            d->rep_from_len = (int)strlen(from);
            d->rep_to_len = (int)strlen(to);
            memcpy(d->rep_from, from, (size_t)d->rep_from_len);
            memcpy(d->rep_to, to, (size_t)d->rep_to_len);
            d->mode = CKV_TK_DEC_SPM;
            stage = 1;
        } else if (!strcmp(st, "ByteFallback") && stage < 2) {
            d->byte_fallback = 1;
            d->mode = CKV_TK_DEC_SPM;
            stage = 2;
        } else if (!strcmp(st, "Fuse") && stage < 3) {
            fuse = 1;
            d->mode = CKV_TK_DEC_SPM;
            stage = 3;
        } else if (!strcmp(st, "Strip") && stage == 3 && fuse) {
            const char *c = ckv_json_string(ckv_json_get(s, "content"));
            const ckv_json *start = ckv_json_get(s, "start"), *stop = ckv_json_get(s, "stop");
            int cl = c ? ckv_utf8_valid_len((const uint8_t *)c, strlen(c)) : 0;
            if (!c || cl <= 0 || (size_t)cl != strlen(c) || !ckv_json_is_number(start) ||
                ckv_json_number(start) < 0 || ckv_json_number(start) > 1000 ||
                (ckv_json_is_number(stop) && ckv_json_number(stop) != 0))
                return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: decoder Strip must strip one character from the start "
                                 "only (stop 0)", L->what);
            ckv_utf8_decode((const uint8_t *)c, &d->strip_char);
            d->strip_start = (int)ckv_json_number(start);
            stage = 4;
        } else {
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                             "%s: decoder '%s' (step %d) is not supported: ckv decodes ByteLevel, Metaspace, or a "
                             "Sequence of Replace, ByteFallback, Fuse, Strip in that order",
                             L->what, st, i);
        }
    }
    return CKV_STATUS_OK;
}

/* ---- model ------------------------------------------------------------------------------------ */

static ckv_status parse_merge(const ld *L, const ckv_json *m, int i, const char **a, size_t *al, const char **b,
                              size_t *bl) {
    if (ckv_json_is_string(m)) {
        const char *s = ckv_json_string(m);
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: merge %d ('%.60s') is not two tokens separated by one space",
                             L->what, i, s);
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return CKV_STATUS_OK;
    }
    if (ckv_json_is_array(m) && ckv_json_array_size(m) == 2) {
        *a = ckv_json_string(ckv_json_array_at(m, 0));
        *b = ckv_json_string(ckv_json_array_at(m, 1));
        if (*a && *b) {
            *al = strlen(*a);
            *bl = strlen(*b);
            return CKV_STATUS_OK;
        }
    }
    return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", L->what, i);
}

static ckv_status parse_model(const ld *L, const ckv_json *m) {
    ckv_tokenizer *t = L->t;
    if (!ckv_json_is_object(m)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: 'model' is missing or not an object", L->what);
    const char *ty = type_of(m);
    if (strcmp(ty, "BPE") != 0 && !(ty[0] == '\0' && ckv_json_get(m, "merges")))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (ckv supports BPE)", L->what,
                         ty[0] ? ty : "(none)");
    const ckv_json *dropout = ckv_json_get(m, "dropout");
    if (ckv_json_is_number(dropout) && ckv_json_number(dropout) != 0.0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", L->what);
    const ckv_json *vocab = ckv_json_get(m, "vocab");
    if (!ckv_json_is_object(vocab)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: model.vocab must be an object", L->what);
    /* added tokens alone cannot encode text: every other piece would be dropped silently */
    if (!ckv_json_first_child(vocab)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: model.vocab is empty", L->what);
    int32_t max_id = -1;
    for (const ckv_json *e = ckv_json_first_child(vocab); e; e = ckv_json_next(e)) {
        int32_t id = -1;
        CKV_TRY(get_id(L, e, "model.vocab", &id));
        if (id > max_id) max_id = id;
    }
    CKV_TRY(ckv_tk_resize(t, max_id + 1));
    for (const ckv_json *e = ckv_json_first_child(vocab); e; e = ckv_json_next(e)) {
        int32_t id = (int32_t)ckv_json_number(e);
        const char *k = ckv_json_key(e);
        CKV_TRY(ckv_tk_set_token(t, id, k, strlen(k)));
    }
    CKV_TRY(ckv_tk_index_vocab(t, L->what));
    t->model = CKV_TK_MODEL_BPE;
    t->byte_fallback = opt_bool(m, "byte_fallback", 0);
    t->fuse_unk = opt_bool(m, "fuse_unk", 0);
    t->ignore_merges = opt_bool(m, "ignore_merges", 0);
    const char *unk = ckv_json_string(ckv_json_get(m, "unk_token"));
    t->unk_id = unk ? ckv_tk_vocab_find(t, unk, strlen(unk)) : -1;
    const char *pre = ckv_json_string(ckv_json_get(m, "continuing_subword_prefix"));
    const char *suf = ckv_json_string(ckv_json_get(m, "end_of_word_suffix"));
    if (pre && *pre) CKV_TRY(dup_str(L, pre, &t->cont_prefix, NULL));
    if (suf && *suf) CKV_TRY(dup_str(L, suf, &t->end_suffix, NULL));
    size_t prefix_len = t->cont_prefix ? strlen(t->cont_prefix) : 0;

    const ckv_json *merges = ckv_json_get(m, "merges");
    int nm = ckv_json_is_array(merges) ? ckv_json_array_size(merges) : 0;
    if (!ckv_json_is_null(merges) && !ckv_json_is_array(merges))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: model.merges must be an array", L->what);
    CKV_TRY(ckv_tk_merges_init(t, (size_t)nm));
    ckv_tk_buf cat = {0};
    int i = 0;
    for (const ckv_json *e = ckv_json_first_child(merges); e; e = ckv_json_next(e), i++) {
        const char *a = "", *b = "";
        size_t al = 0, bl = 0;
        ckv_status s = parse_merge(L, e, i, &a, &al, &b, &bl);
        int32_t ia = -1, ib = -1, inew = -1;
        if (s == CKV_STATUS_OK) {
            ia = ckv_tk_vocab_find(t, a, al);
            ib = ckv_tk_vocab_find(t, b, bl);
            if (ia < 0 || ib < 0)
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: merge %d: token '%.*s' is not in the vocabulary", L->what, i,
                              (int)(ia < 0 ? (al > 60 ? 60 : al) : (bl > 60 ? 60 : bl)), ia < 0 ? a : b);
        }
        if (s == CKV_STATUS_OK) {
            cat.n = 0;
            size_t skip = prefix_len <= bl ? prefix_len : bl;
            s = ckv_tk_buf_append(&cat, a, al);
            if (s == CKV_STATUS_OK) s = ckv_tk_buf_append(&cat, b + skip, bl - skip);
        }
        if (s == CKV_STATUS_OK) {
            inew = ckv_tk_vocab_find(t, cat.p, cat.n);
            if (inew < 0)
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: merge %d: the merged token '%.*s' is not in the vocabulary",
                              L->what, i, (int)(cat.n > 60 ? 60 : cat.n), cat.p);
        }
        if (s != CKV_STATUS_OK) {
            ckv_tk_buf_free(&cat);
            return s;
        }
        ckv_tk_merges_put(t, ia, ib, (uint32_t)i, inew);
    }
    ckv_tk_buf_free(&cat);
    return CKV_STATUS_OK;
}

static ckv_status parse_added(const ld *L, const ckv_json *arr) {
    if (ckv_json_is_null(arr)) return CKV_STATUS_OK;
    if (!ckv_json_is_array(arr)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: added_tokens must be an array", L->what);
    for (int i = 0; i < ckv_json_array_size(arr); i++) {
        const ckv_json *a = ckv_json_array_at(arr, i);
        const char *content = ckv_json_string(ckv_json_get(a, "content"));
        if (!content) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: added_tokens[%d] has no 'content' string", L->what, i);
        int32_t id = -1;
        char ctx[48];
        snprintf(ctx, sizeof ctx, "added_tokens[%d].id", i);
        CKV_TRY(get_id(L, ckv_json_get(a, "id"), ctx, &id));
        int special = opt_bool(a, "special", 0);
        CKV_TRY(ckv_tk_add_token(L->t, id, content, strlen(content), special, opt_bool(a, "normalized", !special),
                                 opt_bool(a, "lstrip", 0), opt_bool(a, "rstrip", 0), opt_bool(a, "single_word", 0)));
    }
    return CKV_STATUS_OK;
}

/* ---- tokenizer_config.json -------------------------------------------------------------------- */

static const char *token_name(const ckv_json *v) {
    if (ckv_json_is_string(v)) return ckv_json_string(v);
    return ckv_json_string(ckv_json_get(v, "content"));
}

static ckv_status apply_config(ckv_tokenizer *t, const ckv_json *cfg) {
    const char *bos = token_name(ckv_json_get(cfg, "bos_token"));
    const char *eos = token_name(ckv_json_get(cfg, "eos_token"));
    const char *pad = token_name(ckv_json_get(cfg, "pad_token"));
    if (bos) t->bos_id = ckv_tokenizer_token_id(t, bos);
    if (eos) t->eos_id = ckv_tokenizer_token_id(t, eos);
    if (pad) t->pad_id = ckv_tokenizer_token_id(t, pad);
    const ckv_json *ct = ckv_json_get(cfg, "chat_template");
    const char *jinja = ckv_json_string(ct);
    if (!jinja && ckv_json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
        for (int i = 0; i < ckv_json_array_size(ct); i++) {
            const ckv_json *e = ckv_json_array_at(ct, i);
            const char *name = ckv_json_string(ckv_json_get(e, "name"));
            if (name && !strcmp(name, "default")) jinja = ckv_json_string(ckv_json_get(e, "template"));
        }
    }
    return jinja ? ckv_tk_chat_from_config(t, jinja) : CKV_STATUS_OK;
}

static void default_specials(ckv_tokenizer *t) {
    if (t->bos_id < 0 && t->n_post_pre == 1) t->bos_id = t->post_pre[0];
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<|im_end|>"};
    for (size_t i = 0; t->eos_id < 0 && i < sizeof eos_names / sizeof eos_names[0]; i++) {
        int32_t id = ckv_tokenizer_token_id(t, eos_names[i]);
        if (id >= 0 && ckv_tokenizer_is_special(t, id)) t->eos_id = id;
    }
    static const char *const eot_names[] = {"<|eot_id|>", "<|im_end|>"};
    for (size_t i = 0; t->eot_id < 0 && i < sizeof eot_names / sizeof eot_names[0]; i++) {
        int32_t id = ckv_tokenizer_token_id(t, eot_names[i]);
        if (id >= 0 && ckv_tokenizer_is_special(t, id)) t->eot_id = id;
    }
}

ckv_status ckv_tokenizer_load_json_buffer(ckv_tokenizer **out, const char *json, size_t len, const char *config_json,
                                          size_t config_len, const char *what) {
    *out = NULL;
    if (!what) what = "tokenizer.json";
    ckv_json *root = NULL, *cfg = NULL;
    CKV_TRY(ckv_json_parse_buffer(&root, json, len, what));
    ckv_tokenizer *t = NULL;
    ckv_status s = CKV_STATUS_OK;
    if (!ckv_json_is_object(root)) s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: top level is not a JSON object", what);
    if (s == CKV_STATUS_OK) s = ckv_tk_alloc(&t);
    ld L = {t, what};
    if (s == CKV_STATUS_OK) s = parse_model(&L, ckv_json_get(root, "model"));
    if (s == CKV_STATUS_OK) s = parse_normalizer(&L, ckv_json_get(root, "normalizer"), 0);
    if (s == CKV_STATUS_OK) s = parse_pre(&L, ckv_json_get(root, "pre_tokenizer"), 0);
    if (s == CKV_STATUS_OK) s = parse_added(&L, ckv_json_get(root, "added_tokens"));
    if (s == CKV_STATUS_OK) s = ckv_tk_index_added(t);
    if (s == CKV_STATUS_OK) s = parse_post(&L, ckv_json_get(root, "post_processor"), 0);
    if (s == CKV_STATUS_OK) s = parse_decoder(&L, ckv_json_get(root, "decoder"));
    for (int i = 0; s == CKV_STATUS_OK && i < t->n_post_pre + t->n_post_post; i++) {
        int32_t id = i < t->n_post_pre ? t->post_pre[i] : t->post_post[i - t->n_post_pre];
        size_t l;
        if (!ckv_tk_text(t, id, &l))
            s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: post_processor adds token id %d, which has no token", what, (int)id);
    }
    if (s == CKV_STATUS_OK && t->n_vocab == 0) s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the vocabulary is empty", what);
    if (s == CKV_STATUS_OK && config_json) {
        char cwhat[320];
        snprintf(cwhat, sizeof cwhat, "%s (tokenizer_config.json)", what);
        s = ckv_json_parse_buffer(&cfg, config_json, config_len, cwhat);
        if (s == CKV_STATUS_OK) s = apply_config(t, cfg);
    }
    if (s == CKV_STATUS_OK) default_specials(t);
    ckv_json_free(root);
    ckv_json_free(cfg);
    if (s != CKV_STATUS_OK) {
        ckv_tokenizer_free(t);
        return s;
    }
    *out = t;
    return CKV_STATUS_OK;
}

ckv_status ckv_tokenizer_load_json(ckv_tokenizer **out, const char *path) {
    *out = NULL;
    if (!path) return ckv_error(CKV_STATUS_ERR_ARG, "tokenizer: no path given");
    struct stat sb;
    if (stat(path, &sb) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    size_t plen = strlen(path);
    char *file = malloc(plen + 32), *conf = malloc(plen + 32);
    if (!file || !conf) {
        free(file);
        free(conf);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, plen + 32, "%s/tokenizer.json", path);
        snprintf(conf, plen + 32, "%s/tokenizer_config.json", path);
    } else {
        snprintf(file, plen + 32, "%s", path);
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(conf, plen + 32, "%.*s/tokenizer_config.json", (int)(slash - path), path);
        else
            snprintf(conf, plen + 32, "tokenizer_config.json");
    }
    char *json = NULL, *cj = NULL;
    size_t jl = 0, cl = 0;
    ckv_status s = ckv_read_file(file, &json, &jl);
    if (s == CKV_STATUS_OK) {
        struct stat cs;
        if (stat(conf, &cs) == 0 && S_ISREG(cs.st_mode)) s = ckv_read_file(conf, &cj, &cl);
    }
    if (s == CKV_STATUS_OK) s = ckv_tokenizer_load_json_buffer(out, json, jl, cj, cl, file);
    free(json);
    free(cj);
    free(file);
    free(conf);
    return s;
}
