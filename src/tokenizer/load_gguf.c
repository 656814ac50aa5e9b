/* load_gguf.c - builds a tokenizer from the tokenizer part of GGUF metadata handed over as plain
 * arrays (ckv_tokenizer_gguf_vocab): "gpt2" vocabularies become byte-level merges BPE with the
 * pre-tokenizer that tokenizer.ggml.pre names (the same steps the model's tokenizer.json has),
 * "llama" vocabularies become SentencePiece-style score BPE with byte fallback and "▁" for spaces.
 * Control and unknown tokens are special added tokens, user-defined tokens plain added tokens. It does not read
 * GGUF files: src/model's reader fills the struct. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define MAX_VOCAB (1 << 21)

static const char k_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char k_llama3_regex[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_qwen2_regex[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static ckv_status push_pre(ckv_tokenizer *t, ckv_tk_pre p) {
    ckv_tk_pre *q = realloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *q);
    if (!q) {
        ckv_tk_pre_free(&p);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "GGUF tokenizer: out of memory");
    }
    t->pres = q;
    t->pres[t->n_pres++] = p;
    return CKV_STATUS_OK;
}

static ckv_status push_norm(ckv_tokenizer *t, ckv_tk_norm_kind kind, const char *a, const char *b) {
    ckv_tk_norm n;
    memset(&n, 0, sizeof n);
    n.kind = kind;
    if (a) {
        n.a_len = strlen(a);
        n.a = malloc(n.a_len + 1);
        if (n.a) memcpy(n.a, a, n.a_len + 1);
    }
    if (b) {
        n.b_len = strlen(b);
        n.b = malloc(n.b_len + 1);
        if (n.b) memcpy(n.b, b, n.b_len + 1);
    }
    ckv_tk_norm *q = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *q);
    if ((a && !n.a) || (b && !n.b) || !q) {
        if (q) t->norms = q;
        ckv_tk_norm_free(&n);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "GGUF tokenizer: out of memory");
    }
    t->norms = q;
    t->norms[t->n_norms++] = n;
    return CKV_STATUS_OK;
}

static ckv_status regex_pre(ckv_tokenizer *t, const char *pattern, int bytelevel_regex) {
    ckv_tk_pre p;
    memset(&p, 0, sizeof p);
    if (pattern) {
        p.kind = CKV_TK_PRE_SPLIT;
        p.behavior = CKV_TK_SPLIT_ISOLATED;
        CKV_TRY(ckv_tk_regex_compile(&p.re, pattern, strlen(pattern), "GGUF pre-tokenizer"));
        CKV_TRY(push_pre(t, p));
        memset(&p, 0, sizeof p);
    }
    p.kind = CKV_TK_PRE_BYTELEVEL;
    if (bytelevel_regex) CKV_TRY(ckv_tk_regex_compile(&p.re, k_gpt2_regex, strlen(k_gpt2_regex), "GGUF ByteLevel"));
    return push_pre(t, p);
}

static ckv_status setup_gpt2_pre(ckv_tokenizer *t, const char *pre) {
    if (!pre || !strcmp(pre, "default") || !strcmp(pre, "gpt2") || !strcmp(pre, "gpt-2")) return regex_pre(t, NULL, 1);
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) return regex_pre(t, k_llama3_regex, 0);
    if (!strcmp(pre, "qwen2")) {
        CKV_TRY(push_norm(t, CKV_TK_NORM_NFC, NULL, NULL));
        return regex_pre(t, k_qwen2_regex, 0);
    }
    if (!strcmp(pre, "smollm")) {
        ckv_tk_pre p;
        memset(&p, 0, sizeof p);
        p.kind = CKV_TK_PRE_DIGITS;
        p.individual = 1;
        CKV_TRY(push_pre(t, p));
        return regex_pre(t, NULL, 1);
    }
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                     "GGUF pre-tokenizer '%s' is not supported (supported: default, gpt2, llama-bpe, qwen2, smollm)", pre);
}

static size_t slen(const char *s, const uint64_t *lens, int64_t i) { return lens ? (size_t)lens[i] : strlen(s); }

ckv_status ckv_tokenizer_load_gguf_vocab(ckv_tokenizer **out, const ckv_tokenizer_gguf_vocab *v) {
    *out = NULL;
    if (!v || !v->model) return ckv_error(CKV_STATUS_ERR_ARG, "GGUF tokenizer: tokenizer.ggml.model is missing");
    int gpt2 = !strcmp(v->model, "gpt2"), llama = !strcmp(v->model, "llama");
    if (!gpt2 && !llama)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "GGUF tokenizer model '%s' is not supported (supported: gpt2, llama)", v->model);
    if (v->n_tokens <= 0 || v->n_tokens > MAX_VOCAB || !v->tokens)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: tokenizer.ggml.tokens has %lld entries",
                         (long long)v->n_tokens);
    if (llama && !v->scores)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: a llama vocabulary needs tokenizer.ggml.scores");
    if (gpt2 && v->n_merges > 0 && !v->merges)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: tokenizer.ggml.merges is missing");
    ckv_tokenizer *t = NULL;
    CKV_TRY(ckv_tk_alloc(&t));
    ckv_status s = ckv_tk_resize(t, (int32_t)v->n_tokens);
    for (int64_t i = 0; i < v->n_tokens && s == CKV_STATUS_OK; i++) {
        if (!v->tokens[i]) {
            s = ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: token %lld is missing", (long long)i);
            break;
        }
        s = ckv_tk_set_token(t, (int32_t)i, v->tokens[i], slen(v->tokens[i], v->token_len, i));
    }
    if (s == CKV_STATUS_OK) s = ckv_tk_index_vocab(t, "GGUF tokenizer");
    if (s == CKV_STATUS_OK && llama) {
        t->model = CKV_TK_MODEL_SPM_SCORES;
        t->scores = malloc((size_t)v->n_tokens * sizeof *t->scores);
        if (!t->scores) s = ckv_error(CKV_STATUS_ERR_NOMEM, "GGUF tokenizer: out of memory");
        else memcpy(t->scores, v->scores, (size_t)v->n_tokens * sizeof *t->scores);
        t->byte_fallback = 1;
        int prefix = v->add_space_prefix != 0;
        if (s == CKV_STATUS_OK && prefix) s = push_norm(t, CKV_TK_NORM_PREPEND, "\xe2\x96\x81", NULL);
        if (s == CKV_STATUS_OK) s = push_norm(t, CKV_TK_NORM_REPLACE, " ", "\xe2\x96\x81");
        t->dec.mode = CKV_TK_DEC_SPM;
        t->dec.replace = 1;
        memcpy(t->dec.rep_from, "\xe2\x96\x81", 3);
        t->dec.rep_from_len = 3;
        t->dec.rep_to[0] = ' ';
        t->dec.rep_to_len = 1;
        t->dec.byte_fallback = 1;
        t->dec.strip_char = ' ';
        t->dec.strip_start = prefix ? 1 : 0;
    }
    if (s == CKV_STATUS_OK && gpt2) {
        t->model = CKV_TK_MODEL_BPE;
        t->dec.mode = CKV_TK_DEC_BYTELEVEL;
        s = setup_gpt2_pre(t, v->pre);
        if (s == CKV_STATUS_OK) s = ckv_tk_merges_init(t, v->n_merges > 0 ? (size_t)v->n_merges : 0);
        ckv_tk_buf cat = {0};
        for (int64_t i = 0; i < v->n_merges && s == CKV_STATUS_OK; i++) {
            const char *m = v->merges[i];
            if (!m) {
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: merge %lld is missing", (long long)i);
                break;
            }
            size_t ml = slen(m, v->merge_len, i);
            const char *sp = memchr(m, ' ', ml);
            if (!sp || memchr(sp + 1, ' ', ml - (size_t)(sp + 1 - m))) {
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: merge %lld ('%.*s') is not two tokens separated by "
                              "one space", (long long)i, (int)(ml > 60 ? 60 : ml), m);
                break;
            }
            size_t al = (size_t)(sp - m), bl = ml - al - 1;
            int32_t a = ckv_tk_vocab_find(t, m, al), b = ckv_tk_vocab_find(t, sp + 1, bl);
            cat.n = 0;
            s = ckv_tk_buf_append(&cat, m, al);
            if (s == CKV_STATUS_OK) s = ckv_tk_buf_append(&cat, sp + 1, bl);
            int32_t c = s == CKV_STATUS_OK ? ckv_tk_vocab_find(t, cat.p, cat.n) : -1;
            if (s == CKV_STATUS_OK && (a < 0 || b < 0 || c < 0))
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: merge %lld ('%.*s') names a token that is not in "
                              "the vocabulary", (long long)i, (int)(ml > 60 ? 60 : ml), m);
            if (s == CKV_STATUS_OK) ckv_tk_merges_put(t, a, b, (uint32_t)i, c);
        }
        ckv_tk_buf_free(&cat);
    }
    /* added tokens: control and unknown (special, as <unk> is in HF's tokenizer.json), user-defined */
    for (int64_t i = 0; i < v->n_tokens && s == CKV_STATUS_OK && v->types; i++) {
        int ty = v->types[i];
        if (ty == CKV_GGUF_TOKEN_UNKNOWN && t->unk_id < 0 && llama) t->unk_id = (int32_t)i;
        int special = ty == CKV_GGUF_TOKEN_CONTROL || ty == CKV_GGUF_TOKEN_UNKNOWN;
        if (!special && ty != CKV_GGUF_TOKEN_USER_DEFINED) continue;
        s = ckv_tk_add_token(t, (int32_t)i, v->tokens[i], slen(v->tokens[i], v->token_len, i), special, 0, 0, 0, 0);
    }
    if (s == CKV_STATUS_OK) s = ckv_tk_index_added(t);
    if (s == CKV_STATUS_OK) {
        int64_t ids[5] = {v->bos_id, v->eos_id, v->unk_id, v->pad_id, v->eot_id};
        static const char *const names[5] = {"bos", "eos", "unknown", "padding", "eot"};
        for (int k = 0; k < 5 && s == CKV_STATUS_OK; k++)
            if (ids[k] < -1 || ids[k] >= v->n_tokens)
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "GGUF tokenizer: %s token id %lld is outside the vocabulary of %lld",
                              names[k], (long long)ids[k], (long long)v->n_tokens);
    }
    if (s == CKV_STATUS_OK) {
        t->bos_id = (int32_t)v->bos_id;
        t->eos_id = (int32_t)v->eos_id;
        /* gpt2 vocabularies cover every byte: like their tokenizer.json (unk_token null), no unk */
        if (v->unk_id >= 0 && llama) t->unk_id = (int32_t)v->unk_id;
        t->pad_id = (int32_t)v->pad_id;
        t->eot_id = (int32_t)v->eot_id;
        int add_bos = v->add_bos >= 0 ? v->add_bos : llama; /* llama.cpp's defaults */
        if (add_bos && t->bos_id >= 0) {
            t->post_pre = malloc(sizeof(int32_t));
            if (!t->post_pre) s = ckv_error(CKV_STATUS_ERR_NOMEM, "GGUF tokenizer: out of memory");
            else t->post_pre[t->n_post_pre++] = t->bos_id;
        }
        if (s == CKV_STATUS_OK && v->add_eos > 0 && t->eos_id >= 0) {
            t->post_post = malloc(sizeof(int32_t));
            if (!t->post_post) s = ckv_error(CKV_STATUS_ERR_NOMEM, "GGUF tokenizer: out of memory");
            else t->post_post[t->n_post_post++] = t->eos_id;
        }
    }
    if (s == CKV_STATUS_OK && v->chat_template) {
        size_t n = v->chat_template_len ? (size_t)v->chat_template_len : strlen(v->chat_template);
        char *j = malloc(n + 1);
        if (!j) {
            s = ckv_error(CKV_STATUS_ERR_NOMEM, "GGUF tokenizer: out of memory");
        } else {
            memcpy(j, v->chat_template, n);
            j[n] = '\0';
            s = ckv_tk_chat_from_config(t, j);
            free(j);
        }
    }
    if (s == CKV_STATUS_OK && t->eot_id < 0) {
        int32_t id = ckv_tokenizer_token_id(t, "<|eot_id|>");
        if (id < 0) id = ckv_tokenizer_token_id(t, "<|im_end|>");
        if (id >= 0 && ckv_tokenizer_is_special(t, id)) t->eot_id = id;
    }
    if (s != CKV_STATUS_OK) {
        ckv_tokenizer_free(t);
        return s;
    }
    *out = t;
    return CKV_STATUS_OK;
}
