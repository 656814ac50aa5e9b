/* test_tokenizer_parity.c - ckv's tokenizer against Hugging Face `tokenizers` on the real tokenizers
 * of Llama 3.x, Qwen2.5/Qwen3, Mistral v0.3 and SmolLM2 (GGUF): for every string of
 * tests/fixtures/tokenizer/corpus.jsonl, the ids recorded in <name>.ids.jsonl (encode without and
 * with special tokens), the decoded text, the streaming decoder, skip-special decoding, and for
 * invalid UTF-8 the strict error. SmolLM2 runs twice, from its tokenizer.json and from the GGUF
 * metadata; Mistral v3's SentencePiece vocabulary also runs as a GGUF "llama" vocabulary (score BPE)
 * against the legacy tokenizer.json (GGUF metadata is read here with a minimal reader: the model's
 * GGUF reader belongs to src/model).
 * The tokenizer files are not committed: tools/models/fetch_tokenizers.sh puts them under
 * <repo>/models/tokenizers (or $CKV_TOKENIZERS_DIR); absent ones are skipped, all absent -> exit 77.
 * Fixtures: .venv-oracle/bin/python tools/oracle/tokenizer_corpus.py */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckv_test.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    char *text;
    size_t len;
    char cat[32];
} item;

static item *g_items;
static int g_n;

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Calls fn on each line of a file (lines end with \n; the buffer is modified). */
static int for_lines(const char *path, int (*fn)(char *line, size_t len, void *ctx), void *ctx) {
    char *buf;
    size_t len;
    if (ckv_read_file(path, &buf, &len) != CKV_STATUS_OK) return -1;
    size_t i = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        char *nl = memchr(buf + i, '\n', len - i);
        size_t l = nl ? (size_t)(nl - (buf + i)) : len - i;
        if (l) rc = fn(buf + i, l, ctx);
        i += l + 1;
    }
    free(buf);
    return rc;
}

static int corpus_line(char *line, size_t len, void *ctx) {
    (void)ctx;
    ckv_json *j;
    if (ckv_json_parse_buffer(&j, line, len, "corpus.jsonl") != CKV_STATUS_OK) return 1;
    item *it = &g_items[g_n];
    const char *hex = ckv_json_string(ckv_json_get(j, "hex"));
    const char *txt = ckv_json_string(ckv_json_get(j, "text"));
    const char *cat = ckv_json_string(ckv_json_get(j, "cat"));
    snprintf(it->cat, sizeof it->cat, "%s", cat ? cat : "");
    if (hex) {
        size_t n = strlen(hex) / 2;
        it->text = malloc(n + 1);
        for (size_t k = 0; k < n; k++) it->text[k] = (char)(hexv(hex[2 * k]) * 16 + hexv(hex[2 * k + 1]));
        it->text[n] = '\0';
        it->len = n;
    } else {
        size_t n = txt ? strlen(txt) : 0;
        it->text = malloc(n + 1);
        memcpy(it->text, txt ? txt : "", n + 1);
        it->len = n;
    }
    g_n++;
    ckv_json_free(j);
    return 0;
}

/* ---- minimal GGUF metadata reader (tokenizer keys only) ---------------------------------------- */

typedef struct {
    FILE *f;
    int bad;
} rdr;

static uint64_t rd_u(rdr *r, int bytes) {
    uint8_t b[8] = {0};
    if (fread(b, 1, (size_t)bytes, r->f) != (size_t)bytes) r->bad = 1;
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static char *rd_str(rdr *r, uint64_t *len) {
    uint64_t n = rd_u(r, 8);
    if (r->bad || n > (1u << 26)) {
        r->bad = 1;
        return NULL;
    }
    char *s = malloc(n + 1);
    if (fread(s, 1, n, r->f) != n) r->bad = 1;
    s[n] = '\0';
    if (len) *len = n;
    return s;
}

static const int k_scalar_size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

typedef struct {
    char **tokens;
    uint64_t *token_len;
    int64_t n_tokens;
    int32_t *types;
    float *scores;
    char **merges;
    uint64_t *merge_len;
    int64_t n_merges;
    char *model, *pre, *chat;
    int64_t bos, eos, unk, pad, eot;
    int add_bos, add_eos, add_space_prefix;
} gguf_tok;

static void skip_value(rdr *r, uint32_t type) {
    if (type == 8) {
        free(rd_str(r, NULL));
    } else if (type == 9) {
        uint32_t et = (uint32_t)rd_u(r, 4);
        uint64_t n = rd_u(r, 8);
        for (uint64_t i = 0; i < n && !r->bad; i++) skip_value(r, et);
    } else if (type < 13 && k_scalar_size[type]) {
        rd_u(r, k_scalar_size[type]);
    } else {
        r->bad = 1;
    }
}

static int64_t rd_int(rdr *r, uint32_t type) {
    if (type < 13 && k_scalar_size[type] && type != 6 && type != 12) {
        uint64_t v = rd_u(r, k_scalar_size[type]);
        if ((type == 5 || type == 11) && k_scalar_size[type] == 4) return (int32_t)v;
        return (int64_t)v;
    }
    skip_value(r, type);
    return -1;
}

static int read_gguf_tokenizer(const char *path, gguf_tok *g) {
    memset(g, 0, sizeof *g);
    g->bos = g->eos = g->unk = g->pad = g->eot = -1;
    g->add_bos = g->add_eos = g->add_space_prefix = -1;
    rdr r = {fopen(path, "rb"), 0};
    if (!r.f) return -1;
    char magic[4];
    if (fread(magic, 1, 4, r.f) != 4 || memcmp(magic, "GGUF", 4) != 0) r.bad = 1;
    rd_u(&r, 4);
    rd_u(&r, 8);
    uint64_t nkv = rd_u(&r, 8);
    for (uint64_t k = 0; k < nkv && !r.bad; k++) {
        char *key = rd_str(&r, NULL);
        uint32_t type = (uint32_t)rd_u(&r, 4);
        if (!key || r.bad) {
            free(key);
            break;
        }
        if (type == 9 && (!strcmp(key, "tokenizer.ggml.tokens") || !strcmp(key, "tokenizer.ggml.merges"))) {
            int is_tok = !strcmp(key, "tokenizer.ggml.tokens");
            uint32_t et = (uint32_t)rd_u(&r, 4);
            uint64_t n = rd_u(&r, 8);
            if (et != 8 || n > (1u << 24)) r.bad = 1;
            char **arr = calloc(n ? n : 1, sizeof *arr);
            uint64_t *lens = calloc(n ? n : 1, sizeof *lens);
            for (uint64_t i = 0; i < n && !r.bad; i++) arr[i] = rd_str(&r, &lens[i]);
            if (is_tok) {
                g->tokens = arr;
                g->token_len = lens;
                g->n_tokens = (int64_t)n;
            } else {
                g->merges = arr;
                g->merge_len = lens;
                g->n_merges = (int64_t)n;
            }
        } else if (type == 9 && !strcmp(key, "tokenizer.ggml.token_type")) {
            uint32_t et = (uint32_t)rd_u(&r, 4);
            uint64_t n = rd_u(&r, 8);
            if (n > (1u << 24)) r.bad = 1;
            g->types = calloc(n ? n : 1, sizeof *g->types);
            for (uint64_t i = 0; i < n && !r.bad; i++) g->types[i] = (int32_t)rd_int(&r, et);
        } else if (type == 9 && !strcmp(key, "tokenizer.ggml.scores")) {
            uint32_t et = (uint32_t)rd_u(&r, 4);
            uint64_t n = rd_u(&r, 8);
            if (et != 6 || n > (1u << 24)) r.bad = 1;
            g->scores = calloc(n ? n : 1, sizeof *g->scores);
            for (uint64_t i = 0; i < n && !r.bad; i++) {
                uint32_t bits = (uint32_t)rd_u(&r, 4);
                memcpy(&g->scores[i], &bits, 4);
            }
        } else if (type == 8 && (!strcmp(key, "tokenizer.ggml.model") || !strcmp(key, "tokenizer.ggml.pre") ||
                                 !strcmp(key, "tokenizer.chat_template"))) {
            char *s = rd_str(&r, NULL);
            if (!strcmp(key, "tokenizer.ggml.model")) g->model = s;
            else if (!strcmp(key, "tokenizer.ggml.pre")) g->pre = s;
            else g->chat = s;
        } else if (!strcmp(key, "tokenizer.ggml.bos_token_id")) g->bos = rd_int(&r, type);
        else if (!strcmp(key, "tokenizer.ggml.eos_token_id")) g->eos = rd_int(&r, type);
        else if (!strcmp(key, "tokenizer.ggml.unknown_token_id")) g->unk = rd_int(&r, type);
        else if (!strcmp(key, "tokenizer.ggml.padding_token_id")) g->pad = rd_int(&r, type);
        else if (!strcmp(key, "tokenizer.ggml.eot_token_id")) g->eot = rd_int(&r, type);
        else if (!strcmp(key, "tokenizer.ggml.add_bos_token")) g->add_bos = (int)rd_int(&r, type);
        else if (!strcmp(key, "tokenizer.ggml.add_eos_token")) g->add_eos = (int)rd_int(&r, type);
        else if (!strcmp(key, "tokenizer.ggml.add_space_prefix")) g->add_space_prefix = (int)rd_int(&r, type);
        else skip_value(&r, type);
        free(key);
    }
    fclose(r.f);
    return r.bad ? -1 : 0;
}

static void free_gguf_tok(gguf_tok *g) {
    for (int64_t i = 0; i < g->n_tokens; i++) free(g->tokens ? g->tokens[i] : NULL);
    for (int64_t i = 0; i < g->n_merges; i++) free(g->merges ? g->merges[i] : NULL);
    free(g->tokens);
    free(g->token_len);
    free(g->merges);
    free(g->merge_len);
    free(g->types);
    free(g->scores);
    free(g->model);
    free(g->pre);
    free(g->chat);
}

/* ---- the comparison ---------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    ckv_tokenizer *tok;
    int32_t pre[8], post[8];
    int n_pre, n_post;
    int lines;
    long mism_ids, mism_special, mism_dec, mism_stream, mism_skip, mism_strict, mism_rt;
    long checked;
} run;

static void print_str(const char *s, size_t len) {
    fputc('"', stderr);
    for (size_t i = 0; i < len && i < 160; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stderr);
        else if (c == '\t') fputs("\\t", stderr);
        else if (c == '\r') fputs("\\r", stderr);
        else if (c == '"' || c == '\\') fprintf(stderr, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fputs(len > 160 ? "\"..." : "\"", stderr);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s [", label);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, i ? ",%d" : "%d", (int)ids[i]);
    fprintf(stderr, n > 40 ? ",...] (%zu)\n" : "] (%zu)\n", n);
}

static int parity_line(char *line, size_t len, void *ctx) {
    run *R = ctx;
    ckv_json *j;
    if (ckv_json_parse_buffer(&j, line, len, R->name) != CKV_STATUS_OK) return 1;
    if (R->lines++ == 0) { /* header */
        const ckv_json *pre = ckv_json_get(j, "special_pre"), *post = ckv_json_get(j, "special_post");
        R->n_pre = ckv_json_array_size(pre);
        R->n_post = ckv_json_array_size(post);
        for (int i = 0; i < R->n_pre && i < 8; i++) R->pre[i] = (int32_t)ckv_json_number(ckv_json_array_at(pre, i));
        for (int i = 0; i < R->n_post && i < 8; i++) R->post[i] = (int32_t)ckv_json_number(ckv_json_array_at(post, i));
        ckv_json_free(j);
        return 0;
    }
    int idx = (int)ckv_json_number(ckv_json_get(j, "i"));
    if (idx < 0 || idx >= g_n) {
        ckv_json_free(j);
        return 1;
    }
    const item *it = &g_items[idx];
    int invalid = !strcmp(it->cat, "invalid_utf8");
    const ckv_json *jids = ckv_json_get(j, "ids");
    size_t n_ref = (size_t)ckv_json_array_size(jids);
    int32_t *ref = malloc((n_ref + 1) * sizeof *ref);
    for (size_t k = 0; k < n_ref; k++) ref[k] = (int32_t)ckv_json_number(ckv_json_array_at(jids, (int)k));
    R->checked++;

    int32_t *ids = NULL;
    size_t n = 0;
    unsigned flags = invalid ? CKV_TOKENIZE_UTF8_REPLACE : 0;
    ckv_status s = ckv_tokenizer_encode(R->tok, it->text, it->len, flags, &ids, &n);
    int same = s == CKV_STATUS_OK && n == n_ref && (n == 0 || memcmp(ids, ref, n * sizeof *ids) == 0);
    if (!same) {
        if (R->mism_ids < 5) {
            fprintf(stderr, "  %s: ids differ on string %d (%s): ", R->name, idx, it->cat);
            print_str(it->text, it->len);
            fprintf(stderr, "\n");
            print_ids("HF  ", ref, n_ref);
            if (s == CKV_STATUS_OK) print_ids("ckv ", ids, n);
            else fprintf(stderr, "    ckv error: %s\n", ckv_error_message());
        }
        R->mism_ids++;
    }
    if (invalid) { /* strict mode must refuse, naming the offset */
        int32_t *x = NULL;
        size_t nx = 0;
        ckv_error_clear();
        ckv_status st = ckv_tokenizer_encode(R->tok, it->text, it->len, 0, &x, &nx);
        if (st != CKV_STATUS_ERR_FORMAT || !strstr(ckv_error_message(), "not valid UTF-8")) R->mism_strict++;
        free(x);
    }
    /* with special tokens */
    int32_t *full = NULL;
    size_t nf = 0;
    s = ckv_tokenizer_encode(R->tok, it->text, it->len, flags | CKV_TOKENIZE_ADD_SPECIAL, &full, &nf);
    int ok_special = s == CKV_STATUS_OK && nf == (size_t)(R->n_pre + R->n_post) + n_ref &&
                     (R->n_pre == 0 || memcmp(full, R->pre, (size_t)R->n_pre * 4) == 0) &&
                     (n_ref == 0 || memcmp(full + R->n_pre, ref, n_ref * 4) == 0) &&
                     (R->n_post == 0 || memcmp(full + R->n_pre + n_ref, R->post, (size_t)R->n_post * 4) == 0);
    if (!ok_special) R->mism_special++;
    free(full);

    /* decode of HF's ids */
    const char *dec_ref = ckv_json_string(ckv_json_get(j, "dec"));
    size_t dec_ref_len = dec_ref ? strlen(dec_ref) : 0;
    if (!dec_ref) {
        if (invalid) { /* the reference decode equals the replaced text; rebuild it */
            dec_ref = NULL;
        } else {
            dec_ref = it->text;
            dec_ref_len = it->len;
        }
    }
    char *dec = NULL;
    size_t dl = 0;
    s = ckv_tokenizer_decode(R->tok, ref, n_ref, 0, &dec, &dl);
    if (s == CKV_STATUS_OK && dec_ref && !(dl == dec_ref_len && memcmp(dec, dec_ref, dl) == 0)) {
        if (R->mism_dec < 5) {
            fprintf(stderr, "  %s: decode differs on string %d: HF ", R->name, idx);
            print_str(dec_ref, dec_ref_len);
            fprintf(stderr, " ckv ");
            print_str(dec, dl);
            fprintf(stderr, "\n");
        }
        R->mism_dec++;
    } else if (s != CKV_STATUS_OK) {
        R->mism_dec++;
    }
    /* round trip where HF round-trips */
    if (!ckv_json_get(j, "dec") && !invalid && s == CKV_STATUS_OK && !(dl == it->len && memcmp(dec, it->text, dl) == 0))
        R->mism_rt++;
    /* the streaming decoder gives the same text */
    if (s == CKV_STATUS_OK) {
        ckv_detok_stream st;
        ckv_detok_stream_init(&st, R->tok, 0);
        size_t cap = ckv_detok_stream_cap(R->tok);
        char *piece = malloc(cap), *acc = malloc(dl + cap + 1);
        size_t an = 0, pn;
        int okst = 1;
        for (size_t k = 0; k < n_ref && okst; k++) {
            okst = ckv_detok_stream_push(&st, ref[k], piece, cap, &pn) == CKV_STATUS_OK && an + pn <= dl + cap;
            if (okst) {
                memcpy(acc + an, piece, pn);
                an += pn;
            }
        }
        if (okst && ckv_detok_stream_flush(&st, piece, cap, &pn) == CKV_STATUS_OK && an + pn <= dl + cap) {
            memcpy(acc + an, piece, pn);
            an += pn;
        } else {
            okst = 0;
        }
        if (!okst || an != dl || memcmp(acc, dec, dl) != 0) R->mism_stream++;
        free(piece);
        free(acc);
    }
    /* skip special tokens */
    const char *skip_ref = ckv_json_string(ckv_json_get(j, "dec_skip"));
    if (skip_ref) {
        char *d2 = NULL;
        size_t l2 = 0;
        if (ckv_tokenizer_decode(R->tok, ref, n_ref, CKV_DETOKENIZE_SKIP_SPECIAL, &d2, &l2) != CKV_STATUS_OK ||
            l2 != strlen(skip_ref) || memcmp(d2, skip_ref, l2) != 0)
            R->mism_skip++;
        free(d2);
    }
    free(dec);
    free(ids);
    free(ref);
    ckv_json_free(j);
    return 0;
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

int main(void) {
    const char *env = getenv("CKV_TOKENIZERS_DIR");
    char dir[1024], path[1200];
    if (env && *env) snprintf(dir, sizeof dir, "%s", env);
    else snprintf(dir, sizeof dir, "%s/../../models/tokenizers", CKV_FIXTURES);

    g_items = calloc(100000, sizeof *g_items);
    snprintf(path, sizeof path, "%s/tokenizer/corpus.jsonl", CKV_FIXTURES);
    if (for_lines(path, corpus_line, NULL) != 0 || g_n < 2000) {
        fprintf(stderr, "FAIL: cannot read the corpus %s (%d strings)\n", path, g_n);
        return 1;
    }
    fprintf(stderr, "corpus: %d strings\n", g_n);

    /* name, reference fixture, GGUF file (NULL: <name>/tokenizer.json) */
    static const char *const runs[][3] = {
        {"llama3.2", "llama3.2", NULL},
        {"llama3", "llama3", NULL},
        {"qwen2.5", "qwen2.5", NULL},
        {"qwen3", "qwen3", NULL},
        {"mistral-v3", "mistral-v3", NULL},
        {"mistral-v3-legacy", "mistral-v3-legacy", NULL},
        {"smollm2", "smollm2", NULL},
        {"smollm2-gguf", "smollm2", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
        {"mistral-v3-gguf", "mistral-v3-legacy", "mistral-v3-legacy/vocab.gguf"},
    };
    int ran = 0;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        const char *name = runs[k][0];
        const char *ref_name = runs[k][1];
        int gguf = runs[k][2] != NULL;
        run R;
        memset(&R, 0, sizeof R);
        R.name = name;
        if (gguf) {
            snprintf(path, sizeof path, "%s/%s", dir, runs[k][2]);
            if (!file_exists(path)) {
                fprintf(stderr, "skip %s: %s not present (tools/models/fetch_tokenizers.sh fetches it)\n", name, path);
                continue;
            }
            gguf_tok g;
            if (read_gguf_tokenizer(path, &g) != 0) {
                fprintf(stderr, "FAIL %s: cannot read the tokenizer metadata of %s\n", name, path);
                ckv_test_failures++;
                free_gguf_tok(&g);
                continue;
            }
            ckv_tokenizer_gguf_vocab v = {0};
            v.model = g.model;
            v.pre = g.pre;
            v.n_tokens = g.n_tokens;
            v.tokens = (const char *const *)g.tokens;
            v.token_len = g.token_len;
            v.scores = g.scores;
            v.types = g.types;
            v.n_merges = g.n_merges;
            v.merges = (const char *const *)g.merges;
            v.merge_len = g.merge_len;
            v.bos_id = g.bos;
            v.eos_id = g.eos;
            v.unk_id = g.unk;
            v.pad_id = g.pad;
            v.eot_id = g.eot;
            v.add_bos = g.add_bos;
            v.add_eos = g.add_eos;
            v.add_space_prefix = g.add_space_prefix;
            v.chat_template = g.chat;
            CHECK_OK(ckv_tokenizer_load_gguf_vocab(&R.tok, &v));
            free_gguf_tok(&g);
            if (R.tok && !strcmp(name, "smollm2-gguf")) {
                const ckv_chat_template *ct = ckv_tokenizer_chat_template(R.tok);
                CHECK_MSG(ct->family == CKV_CHAT_CHATML && !strcmp(ct->name, "smollm2"),
                          "SmolLM2 GGUF chat template recognised as %s", ct->name);
            }
        } else {
            snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, name);
            if (!file_exists(path)) {
                fprintf(stderr, "skip %s: %s not present (tools/models/fetch_tokenizers.sh fetches it)\n", name, path);
                continue;
            }
            snprintf(path, sizeof path, "%s/%s", dir, name);
            CHECK_OK(ckv_tokenizer_load_json(&R.tok, path));
        }
        if (!R.tok) continue;
        snprintf(path, sizeof path, "%s/tokenizer/%s.ids.jsonl", CKV_FIXTURES, ref_name);
        if (for_lines(path, parity_line, &R) != 0) {
            fprintf(stderr, "FAIL %s: cannot read %s\n", name, path);
            ckv_test_failures++;
        }
        long bad = R.mism_ids + R.mism_special + R.mism_dec + R.mism_stream + R.mism_skip + R.mism_strict + R.mism_rt;
        fprintf(stderr,
                "%s %s: %ld strings; mismatches: ids %ld, with-special %ld, decode %ld, stream %ld, skip-special %ld, "
                "strict-utf8 %ld, round-trip %ld\n",
                bad ? "FAIL" : "ok  ", name, R.checked, R.mism_ids, R.mism_special, R.mism_dec, R.mism_stream, R.mism_skip,
                R.mism_strict, R.mism_rt);
        if (bad || R.checked < 2000) ckv_test_failures++;
        ckv_tokenizer_free(R.tok);
        ran++;
    }
    for (int i = 0; i < g_n; i++) free(g_items[i].text);
    free(g_items);
    if (!ran) return ckv_test_skip("no real tokenizer files present: run tools/models/fetch_tokenizers.sh");
    return ckv_test_finish("test_tokenizer_parity");
}
