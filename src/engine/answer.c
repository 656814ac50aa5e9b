/* answer.c - one answer's ids, text and finish rules (see answer.h). */
#include "engine/answer.h"

#include <string.h>

#include "core/alloc.h"

const char *ckv_finish_reason_name(ckv_finish_reason r) {
    switch (r) {
    case CKV_FINISH_LENGTH: return "length";
    case CKV_FINISH_STOP: return "stop";
    case CKV_FINISH_EOS: return "eos";
    case CKV_FINISH_CANCELLED: return "cancelled";
    default: return "none";
    }
}

ckv_status ckv_answer_state_init(ckv_answer_state *a, const ckv_answer_config *cfg) {
    memset(a, 0, sizeof *a);
    a->cfg = *cfg;
    if (cfg->max_tokens < 0) return ckv_error(CKV_STATUS_ERR_ARG, "max_tokens must be >= 0, got %d", cfg->max_tokens);
    if (cfg->n_stop_strings > 0 && !cfg->tok) return ckv_error(CKV_STATUS_ERR_ARG, "stop strings need the model's tokenizer");
    for (int i = 0; i < cfg->n_stop_strings; i++) {
        size_t l = cfg->stop_strings[i] ? strlen(cfg->stop_strings[i]) : 0;
        if (l == 0) return ckv_error(CKV_STATUS_ERR_ARG, "stop string %d is empty", i);
        if (l > a->stop_max_len) a->stop_max_len = l;
    }
    ckv_status st = ckv_alloc((void **)&a->ids, sizeof(int32_t) * (size_t)(cfg->max_tokens > 0 ? cfg->max_tokens : 1), "answer ids");
    if (st == CKV_STATUS_OK && cfg->tok && (cfg->keep_text || cfg->n_stop_strings > 0)) {
        a->piece_cap = ckv_detok_stream_cap(cfg->tok);
        /* the whole text, or a window of the longest stop string plus one piece */
        a->text_cap = cfg->keep_text ? (size_t)(cfg->max_tokens + 1) * a->piece_cap + 1 : a->stop_max_len + a->piece_cap + 1;
        st = ckv_alloc((void **)&a->piece, a->piece_cap, "answer text");
        if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&a->text, a->text_cap, "answer text");
    }
    if (st != CKV_STATUS_OK) {
        ckv_answer_state_free(a);
        return st;
    }
    ckv_answer_state_reset(a);
    return CKV_STATUS_OK;
}

void ckv_answer_state_free(ckv_answer_state *a) {
    if (!a) return;
    ckv_free(a->ids);
    ckv_free(a->text);
    ckv_free(a->piece);
    memset(a, 0, sizeof *a);
}

void ckv_answer_state_reset(ckv_answer_state *a) {
    a->n_ids = 0;
    a->text_len = a->safe_len = a->text_base = 0;
    if (a->text) a->text[0] = '\0';
    if (a->cfg.tok) ckv_detok_stream_init(&a->ds, a->cfg.tok, CKV_DETOKENIZE_SKIP_SPECIAL);
    a->stop_id = -1;
    a->finish = CKV_FINISH_NONE;
}

static int in_list(const int32_t *v, int n, int32_t x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

/* Appends text (returns the bytes appended); without keep_text only the last stop_max_len - 1 bytes
 * before it are kept. */
static size_t append_text(ckv_answer_state *a, const char *p, size_t n) {
    if (!a->cfg.keep_text) {
        size_t keep = a->stop_max_len > 0 ? a->stop_max_len - 1 : 0;
        if (a->text_len > keep) {
            size_t drop = a->text_len - keep;
            memmove(a->text, a->text + drop, keep);
            a->text_len = keep;
            a->text_base += drop;
        }
    }
    if (a->text_len + n >= a->text_cap) n = a->text_cap - 1 - a->text_len; /* cannot happen with cap's sizing */
    memcpy(a->text + a->text_len, p, n);
    a->text_len += n;
    a->text[a->text_len] = '\0';
    return n;
}

/* The offset of the first stop string in the text from `from` on, or -1. */
static long find_stop(const ckv_answer_state *a, size_t from) {
    long best = -1;
    for (int i = 0; i < a->cfg.n_stop_strings; i++) {
        const char *s = a->cfg.stop_strings[i];
        size_t l = strlen(s);
        for (size_t o = from; o + l <= a->text_len; o++)
            if (!memcmp(a->text + o, s, l)) {
                if (best < 0 || (long)o < best) best = (long)o;
                break;
            }
    }
    return best;
}

ckv_finish_reason ckv_answer_state_push(ckv_answer_state *a, int32_t tok) {
    if (a->finish != CKV_FINISH_NONE) return a->finish;
    if (a->n_ids >= a->cfg.max_tokens) {
        ckv_answer_state_end(a, CKV_FINISH_LENGTH);
        return a->finish;
    }
    ckv_finish_reason fin = CKV_FINISH_NONE;
    if (!a->cfg.ignore_eos && in_list(a->cfg.eos_ids, a->cfg.n_eos_ids, tok)) fin = CKV_FINISH_EOS;
    else if (in_list(a->cfg.stop_ids, a->cfg.n_stop_ids, tok)) fin = CKV_FINISH_STOP;
    if (fin != CKV_FINISH_NONE) { /* the stopping id is not part of the answer */
        a->stop_id = tok;
        ckv_answer_state_end(a, fin);
        return fin;
    }
    a->ids[a->n_ids++] = tok;
    if (a->text) {
        size_t n = 0;
        if (ckv_detok_stream_push(&a->ds, tok, a->piece, a->piece_cap, &n) != CKV_STATUS_OK) {
            ckv_error_clear(); /* an id the vocabulary cannot spell adds no text */
            n = 0;
        }
        n = append_text(a, a->piece, n);
        size_t before = a->text_len - n; /* where the new text starts */
        if (a->cfg.n_stop_strings > 0) {
            size_t from = before > a->stop_max_len ? before - a->stop_max_len : 0;
            long at = find_stop(a, from);
            if (at >= 0) {
                a->text_len = (size_t)at; /* the stop string and what follows are not part of the answer */
                a->text[a->text_len] = '\0';
                a->safe_len = a->text_len;
                a->finish = CKV_FINISH_STOP;
                return a->finish;
            }
        }
        size_t hold = a->stop_max_len > 0 ? a->stop_max_len - 1 : 0;
        size_t safe = a->text_len > hold ? a->text_len - hold : 0;
        if (safe > a->safe_len) a->safe_len = safe;
    }
    if (a->n_ids >= a->cfg.max_tokens) ckv_answer_state_end(a, CKV_FINISH_LENGTH);
    return a->finish;
}

ckv_finish_reason ckv_answer_state_sample(ckv_answer_state *a, ckv_sampler *sampler, const float *logits, int32_t *token) {
    *token = ckv_sampler_sample(sampler, logits);
    return ckv_answer_state_push(a, *token);
}

void ckv_answer_state_end(ckv_answer_state *a, ckv_finish_reason why) {
    if (a->finish != CKV_FINISH_NONE) return;
    if (a->text && why != CKV_FINISH_STOP) {
        size_t n = 0;
        if (ckv_detok_stream_flush(&a->ds, a->piece, a->piece_cap, &n) == CKV_STATUS_OK) (void)append_text(a, a->piece, n);
        else ckv_error_clear();
    }
    a->safe_len = a->text_len;
    a->finish = why;
}
