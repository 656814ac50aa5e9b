/* toolcall_grammar.c - the forced tool-call automaton and its vocabulary mask (see
 * toolcall_grammar.h). */
#include "engine/toolcall_grammar.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* Phases: the literal before the first call, a call's literal up to its arguments (one of lits),
 * the arguments, the literal after them, between calls (sep or the end), the separator literal. */
enum { P_FIRST, P_CALL, P_ARGS, P_CLOSE, P_AFTER, P_SEP, P_LAST, P_END };

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

ckv_status ckv_toolcall_grammar_init(ckv_toolcall_grammar *g, const ckv_toolcall_syntax *syn, const char *const *names, int n,
                                     int parallel) {
    memset(g, 0, sizeof *g);
    if (!syn || n < 1 || n > 65535) return ckv_error(CKV_STATUS_ERR_ARG, "tool_choice: no function to call");
    g->syn = syn;
    g->parallel = parallel;
    CKV_TRY(ckv_alloc((void **)&g->lits, sizeof(char *) * (size_t)n, "tool-call grammar"));
    memset(g->lits, 0, sizeof(char *) * (size_t)n);
    size_t lo = strlen(syn->c_open), lm = strlen(syn->c_mid);
    for (int i = 0; i < n; i++) {
        size_t ln = strlen(names[i]);
        CKV_TRY(ckv_alloc((void **)&g->lits[i], lo + ln + lm + 1, "tool-call grammar"));
        g->n = i + 1;
        memcpy(g->lits[i], syn->c_open, lo);
        memcpy(g->lits[i] + lo, names[i], ln);
        memcpy(g->lits[i] + lo + ln, syn->c_mid, lm + 1);
    }
    qsort(g->lits, (size_t)n, sizeof *g->lits, cmp_str);
    return CKV_STATUS_OK;
}

ckv_status ckv_toolcall_vocab_init(ckv_toolcall_vocab *tv, const ckv_grammar_vocab *gv) {
    memset(tv, 0, sizeof *tv);
    tv->gv = gv;
    int nb = 0;
    for (int t = 0; t < gv->vocab; t++)
        if (memchr(gv->bytes + gv->off[t], '}', gv->off[t + 1] - gv->off[t])) nb++;
    CKV_TRY(ckv_alloc((void **)&tv->brace, sizeof(int32_t) * (size_t)(nb ? nb : 1), "tool-call grammar"));
    for (int t = 0; t < gv->vocab; t++)
        if (memchr(gv->bytes + gv->off[t], '}', gv->off[t + 1] - gv->off[t])) tv->brace[tv->n_brace++] = t;
    return CKV_STATUS_OK;
}

void ckv_toolcall_vocab_free(ckv_toolcall_vocab *tv) {
    if (!tv) return;
    ckv_free(tv->brace);
    memset(tv, 0, sizeof *tv);
}

void ckv_toolcall_grammar_free(ckv_toolcall_grammar *g) {
    if (!g) return;
    for (int i = 0; g->lits && i < g->n; i++) ckv_free(g->lits[i]);
    ckv_free(g->lits);
    memset(g, 0, sizeof *g);
}

static void enter_call(const ckv_toolcall_grammar *g, ckv_toolcall_state *s) {
    s->phase = P_CALL;
    s->lo = 0;
    s->hi = (uint16_t)g->n;
    s->pos = 0;
}

void ckv_toolcall_state_init(const ckv_toolcall_grammar *g, ckv_toolcall_state *s) {
    memset(s, 0, sizeof *s);
    s->phase = P_FIRST;
    if (!g->syn->c_first[0]) enter_call(g, s);
}

static int is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

int ckv_toolcall_step(const ckv_toolcall_grammar *g, ckv_toolcall_state *s, uint8_t b) {
    const ckv_toolcall_syntax *y = g->syn;
    switch (s->phase) {
    case P_FIRST:
    case P_CLOSE:
    case P_SEP:
    case P_LAST: {
        const char *lit = s->phase == P_FIRST ? y->c_first : s->phase == P_CLOSE ? y->c_close : s->phase == P_SEP ? y->c_sep : y->c_last;
        if ((uint8_t)lit[s->pos] != b) return 0;
        if (lit[++s->pos]) return 1;
        if (s->phase == P_CLOSE) s->phase = P_AFTER;
        else if (s->phase == P_LAST) s->phase = P_END;
        else enter_call(g, s);
        return 1;
    }
    case P_END:
        return 0;
    case P_CALL: { /* narrow the sorted literals to those with b at pos (a contiguous run) */
        uint16_t lo = s->lo, hi = s->hi;
        while (lo < hi && (uint8_t)g->lits[lo][s->pos] != b) lo++;
        if (lo == hi) return 0;
        uint16_t h = lo;
        while (h < hi && (uint8_t)g->lits[h][s->pos] == b) h++;
        s->lo = lo;
        s->hi = h;
        s->pos++;
        if (!g->lits[lo][s->pos]) { /* a whole literal (it is then the only one left) */
            s->phase = P_ARGS;
            ckv_json_init(&s->js, 1);
        }
        return 1;
    }
    case P_ARGS:
        if (!ckv_json_complete(&s->js) || is_ws(b)) return ckv_json_step(&s->js, b);
        s->phase = P_CLOSE;
        s->pos = 0;
        return ckv_toolcall_step(g, s, b);
    case P_AFTER:
        if (g->parallel && (uint8_t)y->c_sep[0] == b) {
            s->phase = P_SEP;
            s->pos = 0;
            return ckv_toolcall_step(g, s, b);
        }
        if (y->c_last[0] && (uint8_t)y->c_last[0] == b) {
            s->phase = P_LAST;
            s->pos = 0;
            return ckv_toolcall_step(g, s, b);
        }
        return 0;
    }
    return 0;
}

int ckv_toolcall_can_end(const ckv_toolcall_grammar *g, const ckv_toolcall_state *s) {
    if (s->phase == P_END) return 2;
    if (s->phase != P_AFTER || g->syn->c_last[0]) return 0;
    return g->parallel ? 1 : 2;
}

/* Token k (in gv's first-byte order) from state s1, which already took its first byte. */
static int rest_ok(const ckv_toolcall_grammar *g, const ckv_grammar_vocab *gv, ckv_toolcall_state s1, uint32_t k) {
    for (uint32_t i = gv->k_off[k] + 1; i < gv->k_off[k + 1]; i++)
        if (!ckv_toolcall_step(g, &s1, gv->k_bytes[i])) return 0;
    return 1;
}

int ckv_toolcall_mask(const ckv_toolcall_grammar *g, const ckv_toolcall_vocab *tv, const ckv_toolcall_state *s, const int32_t *eos,
                      int n_eos, uint8_t *allowed) {
    const ckv_grammar_vocab *gv = tv->gv;
    int n = 0;
    if (s->phase == P_ARGS && !ckv_json_complete(&s->js)) {
        /* inside the arguments: the JSON mask, plus the tokens that close them and go on */
        n = ckv_grammar_mask(gv, &s->js, NULL, 0, allowed);
        for (int i = 0; i < tv->n_brace; i++) {
            int32_t t = tv->brace[i];
            if (allowed[t]) continue;
            ckv_toolcall_state s1 = *s;
            int ok = gv->off[t + 1] > gv->off[t];
            for (uint32_t b = gv->off[t]; ok && b < gv->off[t + 1]; b++) ok = ckv_toolcall_step(g, &s1, gv->bytes[b]);
            if (ok) allowed[t] = 1, n++;
        }
    } else {
        memset(allowed, 0, (size_t)gv->vocab);
        for (int b = 0; b < 256; b++) { /* tokens by first byte: one step decides them all when it fails */
            uint32_t lo = gv->first_off[b], hi = gv->first_off[b + 1];
            if (lo == hi) continue;
            ckv_toolcall_state s1 = *s;
            if (!ckv_toolcall_step(g, &s1, (uint8_t)b)) continue;
            for (uint32_t k = lo; k < hi; k++)
                if (rest_ok(g, gv, s1, k)) allowed[gv->by_first[k]] = 1, n++;
        }
    }
    if (ckv_toolcall_can_end(g, s))
        for (int i = 0; i < n_eos; i++)
            if (eos[i] >= 0 && eos[i] < gv->vocab && !allowed[eos[i]]) allowed[eos[i]] = 1, n++;
    return n;
}

int ckv_toolcall_accept(const ckv_toolcall_grammar *g, const ckv_grammar_vocab *gv, ckv_toolcall_state *s, int32_t t) {
    if (t < 0 || t >= gv->vocab) return 0;
    for (uint32_t i = gv->off[t]; i < gv->off[t + 1]; i++)
        if (!ckv_toolcall_step(g, s, gv->bytes[i])) return 0;
    return 1;
}
