/* text.c - a model's tokenizer and prompt rendering (see text.h). */
#include "engine/text.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gguf_file.h"

/* Copies a GGUF string value into a NUL-terminated buffer ("" when absent). */
static void meta_cstr(const ckv_gguf_meta *m, const char *key, char *buf, size_t cap) {
    uint64_t len = 0;
    const char *v = ckv_gguf_meta_string(m, key, &len);
    if (!v) len = 0;
    if (len >= cap) len = cap - 1;
    memcpy(buf, v ? v : "", (size_t)len);
    buf[len] = '\0';
}

static int64_t meta_id(const ckv_gguf_meta *m, const char *key) {
    int64_t v = -1;
    return ckv_gguf_meta_int(m, key, &v) ? v : -1;
}

static int meta_flag(const ckv_gguf_meta *m, const char *key) {
    int64_t v = 0;
    return ckv_gguf_meta_int(m, key, &v) ? (int)(v != 0) : -1;
}

/* The tokenizer.ggml.* metadata of a GGUF file as a tokenizer. */
static ckv_status open_gguf_tokenizer(ckv_tokenizer **out, const char *path) {
    ckv_gguf_meta *m = NULL;
    CKV_TRY(ckv_gguf_meta_open(&m, path));
    char model[64], pre[64];
    meta_cstr(m, "tokenizer.ggml.model", model, sizeof model);
    meta_cstr(m, "tokenizer.ggml.pre", pre, sizeof pre);
    ckv_tokenizer_gguf_vocab v;
    memset(&v, 0, sizeof v);
    v.model = model;
    v.pre = pre[0] ? pre : NULL;
    const char **tokens = NULL, **merges = NULL;
    uint64_t *token_len = NULL, *merge_len = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    int64_t n_scores = 0, n_types = 0;
    ckv_status st = CKV_STATUS_OK;
    if (!model[0]) st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: no tokenizer in the file (metadata tokenizer.ggml.model)", path);
    if (st == CKV_STATUS_OK) st = ckv_gguf_meta_strings(m, "tokenizer.ggml.tokens", &v.n_tokens, &tokens, &token_len);
    if (st == CKV_STATUS_OK) st = ckv_gguf_meta_strings(m, "tokenizer.ggml.merges", &v.n_merges, &merges, &merge_len);
    if (st == CKV_STATUS_OK) st = ckv_gguf_meta_f32s(m, "tokenizer.ggml.scores", &n_scores, &scores);
    if (st == CKV_STATUS_OK) st = ckv_gguf_meta_i32s(m, "tokenizer.ggml.token_type", &n_types, &types);
    if (st == CKV_STATUS_OK && ((scores && n_scores != v.n_tokens) || (types && n_types != v.n_tokens)))
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tokenizer scores/types do not match its %lld tokens", path,
                       (long long)v.n_tokens);
    if (st == CKV_STATUS_OK) {
        v.tokens = tokens;
        v.token_len = token_len;
        v.scores = scores;
        v.types = types;
        v.merges = merges;
        v.merge_len = merge_len;
        v.bos_id = meta_id(m, "tokenizer.ggml.bos_token_id");
        v.eos_id = meta_id(m, "tokenizer.ggml.eos_token_id");
        v.unk_id = meta_id(m, "tokenizer.ggml.unknown_token_id");
        v.pad_id = meta_id(m, "tokenizer.ggml.padding_token_id");
        v.eot_id = meta_id(m, "tokenizer.ggml.eot_token_id");
        v.add_bos = meta_flag(m, "tokenizer.ggml.add_bos_token");
        v.add_eos = meta_flag(m, "tokenizer.ggml.add_eos_token");
        v.add_space_prefix = meta_flag(m, "tokenizer.ggml.add_space_prefix");
        v.chat_template = ckv_gguf_meta_string(m, "tokenizer.chat_template", &v.chat_template_len);
        if (v.chat_template && v.chat_template_len == 0) v.chat_template = NULL;
        st = ckv_tokenizer_load_gguf_vocab(out, &v);
    }
    free(tokens);
    free(token_len);
    free(merges);
    free(merge_len);
    free(scores);
    free(types);
    ckv_gguf_meta_close(m);
    return st;
}

ckv_status ckv_text_open_tokenizer(ckv_tokenizer **out, const char *model_path) {
    *out = NULL;
    struct stat sb;
    if (stat(model_path, &sb) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: no such model file or directory", model_path);
    if (S_ISDIR(sb.st_mode)) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer.json", model_path);
        if (stat(path, &sb) != 0)
            return ckv_error(CKV_STATUS_ERR_IO, "%s: no tokenizer.json in the model directory (text needs one; "
                             "--prompt-ids works without)", model_path);
        return ckv_tokenizer_load_json(out, model_path);
    }
    /* a file: GGUF by its magic, otherwise a tokenizer.json under any name */
    char magic[4] = {0};
    FILE *f = fopen(model_path, "rb");
    size_t got = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    if (got == 4 && !memcmp(magic, "GGUF", 4)) return open_gguf_tokenizer(out, model_path);
    return ckv_tokenizer_load_json(out, model_path);
}

/* Encodes text[len]; with add_special, the tokenizer's own prefix (BOS) is added. plain[n_plain]:
 * the ranges (relative to text) where special-token strings stay text. */
static ckv_status encode(const ckv_tokenizer *tok, const char *text, size_t len, int add_special, const ckv_text_range *plain,
                         size_t n_plain, int32_t **ids, int *n) {
    size_t cnt = 0;
    *ids = NULL;
    *n = 0;
    CKV_TRY(ckv_tokenizer_encode_ranges(tok, text, len, add_special ? CKV_TOKENIZE_ADD_SPECIAL : 0, SIZE_MAX, plain, n_plain,
                                        ids, &cnt));
    if (cnt > (size_t)0x7fffffff) {
        free(*ids);
        *ids = NULL;
        return ckv_error(CKV_STATUS_ERR_RANGE, "prompt of %zu tokens is too long", cnt);
    }
    *n = (int)cnt;
    return CKV_STATUS_OK;
}

/* The content ranges r[n] of a rendered text, as ranges of its part [lo, hi) with the bytes [cut,
 * cut + cut_len) removed from it (the question mark), relative to lo; written to out (room for n). */
static size_t ranges_of_part(const ckv_text_range *r, size_t n, size_t lo, size_t hi, size_t cut, size_t cut_len,
                             ckv_text_range *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t a = r[i].off, b = r[i].off + r[i].len;
        /* map [a, b) through the removal, then clip to the part */
        size_t ma = a <= cut ? a : (a >= cut + cut_len ? a - cut_len : cut);
        size_t mb = b <= cut ? b : (b >= cut + cut_len ? b - cut_len : cut);
        size_t mlo = lo <= cut ? lo : lo - cut_len, mhi = hi <= cut ? hi : hi - cut_len;
        if (ma < mlo) ma = mlo;
        if (mb > mhi) mb = mhi;
        if (mb > ma) out[k++] = (ckv_text_range){ma - mlo, mb - ma};
    }
    return k;
}

ckv_status ckv_text_encode_split(const ckv_tokenizer *tok, const char *context, const char *question, unsigned flags,
                                 const char *template_name, const char *system, int32_t **ctx_ids, int *n_ctx,
                                 int32_t **q_ids, int *n_q) {
    *ctx_ids = *q_ids = NULL;
    *n_ctx = *n_q = 0;
    static const char mark[] = "\x1f" "ckv-question" "\x1f"; /* a unit separator: never in prompts */
    const size_t ml = sizeof mark - 1;
    const char *q = question ? question : "";
    size_t lc = strlen(context), lq = strlen(q);
    char *user = malloc(lc + sizeof mark + lq + 1);
    if (!user) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory rendering the prompt");
    memcpy(user, context, lc);
    memcpy(user + lc, mark, ml);
    memcpy(user + lc + ml, q, lq + 1);
    char *rendered = NULL;
    ckv_text_range *content = NULL, *part = NULL; /* [n_content] the messages' text in rendered */
    size_t n_content = 0;
    ckv_status st = CKV_STATUS_OK;
    int special = 1; /* plain text: the tokenizer adds its BOS; a template carries its own */
    if (flags & CKV_TEXT_CHAT) {
        ckv_chat_template t;
        const ckv_chat_template *tp = ckv_tokenizer_chat_template(tok);
        if (template_name) {
            st = ckv_chat_template_by_name(template_name, &t);
            tp = &t;
        } else if (!tp || tp->family == CKV_CHAT_NONE) {
            st = ckv_error(CKV_STATUS_ERR_ARG, "--chat: the model has no chat template (name one with --template)");
        }
        ckv_chat_message msgs[2];
        int nm = 0;
        if (system) msgs[nm++] = (ckv_chat_message){"system", system};
        msgs[nm++] = (ckv_chat_message){"user", user};
        if (st == CKV_STATUS_OK) st = ckv_chat_apply_ranges(tp, msgs, nm, 1, &rendered, &content, &n_content);
        if (flags & CKV_TEXT_SPECIAL_IN_CONTENT) n_content = 0;
        special = 0;
    } else {
        rendered = user;
        user = NULL;
    }
    if (st == CKV_STATUS_OK && n_content && !(part = malloc(n_content * sizeof *part)))
        st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory rendering the prompt");
    if (st == CKV_STATUS_OK) {
        size_t total = strlen(rendered);
        char *at = strstr(rendered, mark);
        size_t head = at ? (size_t)(at - rendered) : total, tail = at ? head + ml : total, cut_len = at ? ml : 0;
        size_t k;
        if (!question) { /* one prompt: context and the template's tail together */
            k = ranges_of_part(content, n_content, 0, total, head, cut_len, part);
            memmove(rendered + head, rendered + tail, total - tail + 1);
            st = encode(tok, rendered, strlen(rendered), special, part, k, ctx_ids, n_ctx);
        } else {
            k = ranges_of_part(content, n_content, 0, head, head, cut_len, part);
            st = encode(tok, rendered, head, special, part, k, ctx_ids, n_ctx);
            k = ranges_of_part(content, n_content, tail, total, head, cut_len, part);
            if (st == CKV_STATUS_OK) st = encode(tok, rendered + tail, total - tail, 0, part, k, q_ids, n_q);
        }
    }
    free(content);
    free(part);
    free(user);
    free(rendered);
    if (st != CKV_STATUS_OK) {
        free(*ctx_ids);
        free(*q_ids);
        *ctx_ids = *q_ids = NULL;
        *n_ctx = *n_q = 0;
    }
    return st;
}
