/* grammar.c - the JSON automaton and the vocabulary mask (see grammar.h). */
#include "engine/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* lexical states */
enum {
    S_VALUE = 0, /* a value must start (after ':' or ',' in an array, or at the top) */
    S_VALUE_OR_CLOSE, /* after '[': a value or ']' */
    S_KEY_OR_CLOSE,   /* after '{': '"' or '}' */
    S_KEY,            /* after ',' in an object: '"' */
    S_STR,            /* inside a string */
    S_STR_ESC,        /* after '\' */
    S_STR_U,          /* inside \uXXXX (sub: hex digits read) */
    S_STR_U8,         /* inside a multi-byte UTF-8 character (u8: continuation bytes to come) */
    S_COLON,          /* after a key */
    S_AFTER,          /* after a value inside a container: ',' or the closing bracket */
    S_NUM_MINUS,      /* '-' read: a digit */
    S_NUM_ZERO,       /* a leading 0: '.', 'e' or the end */
    S_NUM_INT,        /* digits */
    S_NUM_DOT,        /* '.': a digit */
    S_NUM_FRAC,       /* fraction digits */
    S_NUM_E,          /* 'e': sign or digit */
    S_NUM_ESIGN,      /* sign: a digit */
    S_NUM_EXP,        /* exponent digits */
    S_LIT,            /* inside true / false / null (key: which, sub: bytes matched) */
    S_DONE            /* the value is complete */
};

static const char *const literals[3] = {"true", "false", "null"};

void ckv_json_init(ckv_json_state *s, int top_object) {
    memset(s, 0, sizeof *s);
    s->st = S_VALUE;
    s->top_object = (uint8_t)(top_object != 0);
}

int ckv_json_complete(const ckv_json_state *s) { return s->st == S_DONE; }

static int is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
static int is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
static int is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

/* A value ended: back in the container (or done at the top). */
static void value_done(ckv_json_state *s) { s->st = s->depth == 0 ? S_DONE : S_AFTER; }

/* A value starting with byte b (S_VALUE / S_VALUE_OR_CLOSE). */
static int value_start(ckv_json_state *s, uint8_t b) {
    if (s->depth == 0 && s->top_object && b != '{') return 0;
    switch (b) {
    case '{':
    case '[':
        if (s->depth >= CKV_JSON_MAX_DEPTH) return 0;
        if (b == '{') s->objects |= 1ull << s->depth;
        else s->objects &= ~(1ull << s->depth);
        s->depth++;
        s->st = b == '{' ? S_KEY_OR_CLOSE : S_VALUE_OR_CLOSE;
        return 1;
    case '"': s->st = S_STR, s->key = 0; return 1;
    case '-': s->st = S_NUM_MINUS; return 1;
    case '0': s->st = S_NUM_ZERO; return 1;
    case 't': s->st = S_LIT, s->key = 0, s->sub = 1; return 1;
    case 'f': s->st = S_LIT, s->key = 1, s->sub = 1; return 1;
    case 'n': s->st = S_LIT, s->key = 2, s->sub = 1; return 1;
    default:
        if (b >= '1' && b <= '9') {
            s->st = S_NUM_INT;
            return 1;
        }
        return 0;
    }
}

/* The closing bracket of the innermost container. */
static int close_container(ckv_json_state *s, uint8_t b) {
    if (s->depth == 0 || (b == '}') != (int)((s->objects >> (s->depth - 1)) & 1)) return 0;
    s->depth--;
    value_done(s);
    return 1;
}

/* What may follow a value inside a container (S_AFTER); numbers end here too. */
static int after_value(ckv_json_state *s, uint8_t b) {
    if (s->st == S_DONE) return is_ws(b);
    if (is_ws(b)) {
        s->st = S_AFTER;
        return 1;
    }
    if (b == ',') {
        s->st = (s->objects >> (s->depth - 1)) & 1 ? S_KEY : S_VALUE;
        return 1;
    }
    if (b == '}' || b == ']') return close_container(s, b);
    return 0;
}

/* A number may end at any byte it cannot take: that byte then belongs to what follows it. */
static int number_end(ckv_json_state *s, uint8_t b) {
    value_done(s);
    return after_value(s, b);
}

static int step(ckv_json_state *s, uint8_t b) {
    switch (s->st) {
    case S_VALUE: return is_ws(b) || value_start(s, b);
    case S_VALUE_OR_CLOSE: return is_ws(b) || (b == ']' ? close_container(s, b) : value_start(s, b));
    case S_KEY_OR_CLOSE:
        if (b == '}') return close_container(s, b);
        /* fall through */
    case S_KEY:
        if (is_ws(b)) return 1;
        if (b != '"') return 0;
        s->st = S_STR, s->key = 1;
        return 1;
    case S_STR:
        if (b == '"') {
            if (s->key) s->st = S_COLON;
            else value_done(s);
            return 1;
        }
        if (b == '\\') {
            s->st = S_STR_ESC;
            return 1;
        }
        if (b < 0x80) return b >= 0x20;
        /* a multi-byte character (its bytes may be split over tokens): lead byte, then continuations */
        if (b >= 0xC2 && b <= 0xDF) s->u8 = 1;
        else if (b >= 0xE0 && b <= 0xEF) s->u8 = 2;
        else if (b >= 0xF0 && b <= 0xF4) s->u8 = 3;
        else return 0;
        s->st = S_STR_U8;
        return 1;
    case S_STR_U8:
        if ((b & 0xC0) != 0x80) return 0;
        if (--s->u8 == 0) s->st = S_STR;
        return 1;
    case S_STR_ESC:
        if (b == 'u') {
            s->st = S_STR_U, s->sub = 0;
            return 1;
        }
        if (!strchr("\"\\/bfnrt", b) || b == 0) return 0;
        s->st = S_STR;
        return 1;
    case S_STR_U:
        if (!is_hex(b)) return 0;
        if (++s->sub == 4) s->st = S_STR;
        return 1;
    case S_COLON:
        if (is_ws(b)) return 1;
        if (b != ':') return 0;
        s->st = S_VALUE;
        return 1;
    case S_AFTER:
    case S_DONE: return after_value(s, b);
    case S_NUM_MINUS:
        if (b == '0') s->st = S_NUM_ZERO;
        else if (is_digit(b)) s->st = S_NUM_INT;
        else return 0;
        return 1;
    case S_NUM_ZERO:
    case S_NUM_INT:
        if (is_digit(b) && s->st == S_NUM_INT) return 1;
        if (b == '.') s->st = S_NUM_DOT;
        else if (b == 'e' || b == 'E') s->st = S_NUM_E;
        else return number_end(s, b);
        return 1;
    case S_NUM_DOT:
        if (!is_digit(b)) return 0;
        s->st = S_NUM_FRAC;
        return 1;
    case S_NUM_FRAC:
        if (is_digit(b)) return 1;
        if (b == 'e' || b == 'E') {
            s->st = S_NUM_E;
            return 1;
        }
        return number_end(s, b);
    case S_NUM_E:
        if (b == '+' || b == '-') s->st = S_NUM_ESIGN;
        else if (is_digit(b)) s->st = S_NUM_EXP;
        else return 0;
        return 1;
    case S_NUM_ESIGN:
        if (!is_digit(b)) return 0;
        s->st = S_NUM_EXP;
        return 1;
    case S_NUM_EXP: return is_digit(b) || number_end(s, b);
    case S_LIT: {
        const char *l = literals[s->key];
        if ((uint8_t)l[s->sub] != b) return 0;
        if (l[++s->sub] == '\0') value_done(s);
        return 1;
    }
    default: return 0;
    }
}

int ckv_json_step(ckv_json_state *s, uint8_t b) {
    int in_str = s->st == S_STR || s->st == S_STR_ESC || s->st == S_STR_U || s->st == S_STR_U8;
    if (!step(s, b)) return 0;
    if (!in_str && is_ws(b)) { /* a bounded run of blanks between tokens of the value */
        if (++s->ws > CKV_JSON_MAX_WS) return 0;
    } else {
        s->ws = 0;
    }
    return 1;
}

/* ---- the vocabulary -------------------------------------------------------------------------------- */

ckv_status ckv_grammar_vocab_init(ckv_grammar_vocab *gv, const ckv_tokenizer *tok, int vocab) {
    memset(gv, 0, sizeof *gv);
    gv->vocab = vocab;
    size_t cap = ckv_tokenizer_max_piece_bytes(tok) + 16;
    char *piece = malloc(cap);
    ckv_status st = piece ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the grammar vocabulary");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->off, sizeof(uint32_t) * ((size_t)vocab + 1), "grammar token offsets");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->plain, (size_t)vocab, "grammar plain tokens");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->by_first, sizeof(int32_t) * (size_t)vocab, "grammar first bytes");
    size_t total = 0;
    for (int t = 0; st == CKV_STATUS_OK && t < vocab; t++) { /* sizes first */
        int n = ckv_tokenizer_is_special(tok, t) ? 0 : ckv_tokenizer_token_to_piece(tok, t, piece, cap);
        total += n > 0 ? (size_t)n : 0;
    }
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->bytes, total > 0 ? total : 1, "grammar token bytes");
    uint32_t count[256] = {0};
    size_t at = 0;
    for (int t = 0; st == CKV_STATUS_OK && t < vocab; t++) {
        int n = ckv_tokenizer_is_special(tok, t) ? 0 : ckv_tokenizer_token_to_piece(tok, t, piece, cap);
        if (n < 0) n = 0;
        gv->off[t] = (uint32_t)at;
        memcpy(gv->bytes + at, piece, (size_t)n);
        /* plain: accepted inside a string from any state between characters, leaving it there */
        ckv_json_state probe;
        ckv_json_init(&probe, 0);
        probe.st = S_STR;
        int plain = n > 0;
        for (int i = 0; i < n && plain; i++) plain = piece[i] != '"' && piece[i] != '\\' && ckv_json_step(&probe, (uint8_t)piece[i]);
        plain = plain && probe.st == S_STR;
        gv->plain[t] = (uint8_t)plain;
        if (n > 0) count[(uint8_t)piece[0]]++;
        at += (size_t)n;
    }
    if (st == CKV_STATUS_OK) {
        gv->off[vocab] = (uint32_t)at;
        gv->first_off[0] = 0;
        for (int b = 0; b < 256; b++) gv->first_off[b + 1] = gv->first_off[b] + count[b];
        gv->n_first = gv->first_off[256];
        uint32_t fill[256];
        memcpy(fill, gv->first_off, sizeof fill);
        for (int t = 0; t < vocab; t++)
            if (gv->off[t + 1] > gv->off[t]) gv->by_first[fill[gv->bytes[gv->off[t]]]++] = t;
        st = ckv_alloc((void **)&gv->k_off, sizeof(uint32_t) * ((size_t)gv->n_first + 1), "grammar ordered offsets");
    }
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->k_bytes, at > 0 ? at : 1, "grammar ordered bytes");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->k_plain, gv->n_first > 0 ? gv->n_first : 1, "grammar ordered plain");
    if (st == CKV_STATUS_OK) {
        size_t o = 0;
        for (uint32_t k = 0; k < gv->n_first; k++) {
            int32_t t = gv->by_first[k];
            size_t n = gv->off[t + 1] - gv->off[t];
            gv->k_off[k] = (uint32_t)o;
            memcpy(gv->k_bytes + o, gv->bytes + gv->off[t], n);
            gv->k_plain[k] = gv->plain[t];
            o += n;
        }
        gv->k_off[gv->n_first] = (uint32_t)o;
    }
    free(piece);
    if (st != CKV_STATUS_OK) ckv_grammar_vocab_free(gv);
    return st;
}

void ckv_grammar_vocab_free(ckv_grammar_vocab *gv) {
    if (!gv) return;
    ckv_free(gv->off);
    ckv_free(gv->bytes);
    ckv_free(gv->plain);
    ckv_free(gv->by_first);
    ckv_free(gv->k_off);
    ckv_free(gv->k_bytes);
    ckv_free(gv->k_plain);
    memset(gv, 0, sizeof *gv);
}

/* 1 when the bytes of ordered token k after its first are accepted from s (advanced past the first). */
static int accepts_rest(const ckv_grammar_vocab *gv, ckv_json_state s, uint32_t k) {
    for (uint32_t i = gv->k_off[k] + 1; i < gv->k_off[k + 1]; i++)
        if (!ckv_json_step(&s, gv->k_bytes[i])) return 0;
    return 1;
}

int ckv_grammar_mask(const ckv_grammar_vocab *gv, const ckv_json_state *s, const int32_t *eos, int n_eos, uint8_t *allowed) {
    memset(allowed, 0, (size_t)gv->vocab);
    int n = 0;
    if (ckv_json_complete(s)) { /* the value is whole: only the end */
        for (int i = 0; i < n_eos; i++)
            if (eos[i] >= 0 && eos[i] < gv->vocab && !allowed[eos[i]]) allowed[eos[i]] = 1, n++;
        return n;
    }
    const int in_str = s->st == S_STR;
    for (int b = 0; b < 256; b++) { /* tokens by first byte: one step decides them all when it fails */
        uint32_t lo = gv->first_off[b], hi = gv->first_off[b + 1];
        if (lo == hi) continue;
        ckv_json_state s1 = *s;
        if (!ckv_json_step(&s1, (uint8_t)b)) continue;
        for (uint32_t k = lo; k < hi; k++)
            if ((in_str && gv->k_plain[k]) || accepts_rest(gv, s1, k)) allowed[gv->by_first[k]] = 1, n++;
    }
    return n;
}

int ckv_grammar_accept(const ckv_grammar_vocab *gv, ckv_json_state *s, int32_t t) {
    if (t < 0 || t >= gv->vocab) return 0;
    for (uint32_t i = gv->off[t]; i < gv->off[t + 1]; i++)
        if (!ckv_json_step(s, gv->bytes[i])) return 0;
    return 1;
}
