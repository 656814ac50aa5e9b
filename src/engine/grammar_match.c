/* grammar_match.c - the pushdown matcher and the vocabulary mask (see grammar.h). A state is a set of
 * stacks; a stack is its top node (the element it waits on) and a chain of continuation nodes (where
 * to go when a rule ends), all in one arena, so stacks share their lower parts and a step only adds
 * nodes. The mask walks the vocabulary's byte trie depth first, one state per depth, so tokens that
 * share a prefix share its work and a refused byte skips its whole subtree; inside a JSON string the
 * plain-content tokens are allowed by their character count without a walk, and only the other
 * tokens are walked. It does not build grammars (grammar_rules.c) or read token bytes (grammar_vocab.c). */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "engine/grammar_impl.h"

#define SETTLE_BUDGET 4096 /* expansion steps per byte (an ambiguous grammar cannot stall a step) */
#define SETTLE_DEPTH 256   /* rules entered without reading a byte */
#define ARENA_NODES (1u << 15)

uint32_t ckv_grammar_str_step(uint32_t aux, uint8_t b, uint32_t hi) {
    uint32_t cnt = CKV_STR_COUNT(aux), sub = CKV_STR_SUB(aux);
    switch (sub) {
    case 0:
        if (b == '"' || b < 0x20 || (b >= 0x80 && b < 0xC2) || b > 0xF4) return CKV_STR_REFUSED;
        if (hi != CKV_GRAMMAR_UNBOUNDED && cnt + 1 > hi) return CKV_STR_REFUSED;
        if (cnt < 0xFFFFFFu) cnt++; /* counted at its first byte */
        /* UTF-8 as RFC 3629 has it: no overlong forms, surrogates or code points past U+10FFFF */
        sub = b == '\\' ? 4 : b < 0x80 ? 0 : b < 0xE0 ? 1 : b == 0xE0 ? 9 : b == 0xED ? 10 : b < 0xF0 ? 2 : b == 0xF0 ? 11 : b == 0xF4 ? 12 : 3;
        return cnt | sub << 24;
    case 1:
    case 2:
    case 3:
        if ((b & 0xC0) != 0x80) return CKV_STR_REFUSED;
        return cnt | (sub - 1) << 24;
    case 9: /* after E0: A0..BF, then one more */
    case 10: /* after ED: 80..9F */
    case 11: /* after F0: 90..BF, then two more */
    case 12: /* after F4: 80..8F */ {
        static const uint8_t first[4] = {0xA0, 0x80, 0x90, 0x80}, last[4] = {0xBF, 0x9F, 0xBF, 0x8F}, rest[4] = {1, 1, 2, 2};
        if (b < first[sub - 9] || b > last[sub - 9]) return CKV_STR_REFUSED;
        return cnt | (uint32_t)rest[sub - 9] << 24;
    }
    case 4:
        if (b == 'u') return cnt | 5u << 24;
        if (!b || !strchr("\"\\/bfnrt", b)) return CKV_STR_REFUSED;
        return cnt;
    case 13: /* \uD: 0..7 (no surrogate escapes, so every escape is one character) */
        if (b < '0' || b > '7') return CKV_STR_REFUSED;
        return cnt | 7u << 24;
    default: /* 5..8: \u and hex digits */
        if (!((b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'))) return CKV_STR_REFUSED;
        if (sub == 5 && (b == 'd' || b == 'D')) return cnt | 13u << 24;
        return sub == 8 ? cnt : cnt | (sub + 1) << 24;
    }
}

typedef struct {
    uint32_t *tops;
    int n;
    int acc;
    int budget;
} state_out;

static int32_t node_new(ckv_grammar_matcher *m, uint32_t pos, int32_t parent, uint32_t aux, uint32_t nest) {
    if (m->n_nodes >= m->cap) return -1;
    m->nodes[m->n_nodes] = (ckv_grammar_node){.pos = pos, .parent = parent, .aux = aux, .nest = nest};
    return (int32_t)m->n_nodes++;
}

static void add_top(ckv_grammar_matcher *m, state_out *o, uint32_t pos, int32_t parent, uint32_t aux) {
    for (int i = 0; i < o->n; i++) {
        const ckv_grammar_node *x = &m->nodes[o->tops[i]];
        if (x->pos == pos && x->parent == parent && x->aux == aux) return;
    }
    if (o->n >= CKV_GRAMMAR_MAX_TOPS) return; /* too ambiguous: this stack is dropped */
    int32_t k = node_new(m, pos, parent, aux, 0);
    if (k >= 0) o->tops[o->n++] = (uint32_t)k;
}

/* The stacks reachable from element pos (over parent) without reading a byte, into o. */
static void settle(ckv_grammar_matcher *m, state_out *o, uint32_t pos, int32_t parent, uint32_t aux, int depth) {
    if (--o->budget < 0 || depth > SETTLE_DEPTH) return;
    const ckv_grammar *g = m->g;
    const ckv_grammar_el *e = &g->els[pos];
    switch (e->kind) {
    case CKV_GEL_END:
        if (parent < 0) o->acc = 1;
        else settle(m, o, m->nodes[parent].pos, m->nodes[parent].parent, 0, depth + 1);
        return;
    case CKV_GEL_REF: {
        int32_t cont = parent; /* a reference ending its alternative returns straight to the parent */
        if (g->els[pos + 1].kind != CKV_GEL_END) {
            uint32_t nest = parent < 0 ? 0 : m->nodes[parent].nest + 1;
            if (nest >= CKV_GRAMMAR_MAX_NEST || (cont = node_new(m, pos + 1, parent, 0, nest)) < 0) return;
        }
        for (uint32_t a = g->rule_off[e->arg]; a < g->rule_off[e->arg + 1]; a++) settle(m, o, g->alts[a], cont, 0, depth + 1);
        return;
    }
    case CKV_GEL_STR:
        add_top(m, o, pos, parent, aux);
        if (CKV_STR_SUB(aux) == 0 && CKV_STR_COUNT(aux) >= e->arg) settle(m, o, pos + 1, parent, 0, depth + 1);
        return;
    default: add_top(m, o, pos, parent, aux); return;
    }
}

/* The state after byte b from stacks in[n_in], into o. */
static void advance(ckv_grammar_matcher *m, const uint32_t *in, int n_in, uint8_t b, state_out *o) {
    const ckv_grammar *g = m->g;
    o->n = 0;
    o->acc = 0;
    o->budget = SETTLE_BUDGET;
    for (int i = 0; i < n_in; i++) {
        ckv_grammar_node nd = m->nodes[in[i]];
        const ckv_grammar_el *e = &g->els[nd.pos];
        switch (e->kind) {
        case CKV_GEL_BYTE:
            if (e->byte == b) settle(m, o, nd.pos + 1, nd.parent, 0, 0);
            break;
        case CKV_GEL_CLASS:
            if (g->classes[e->arg][b >> 5] >> (b & 31) & 1) settle(m, o, nd.pos + 1, nd.parent, 0, 0);
            break;
        case CKV_GEL_STR: {
            uint32_t aux = ckv_grammar_str_step(nd.aux, b, e->hi);
            if (aux != CKV_STR_REFUSED) settle(m, o, nd.pos, nd.parent, aux, 0);
            break;
        }
        default: break;
        }
    }
}

static uint32_t *level(ckv_grammar_matcher *m, int d) { return m->tops + (size_t)d * CKV_GRAMMAR_MAX_TOPS; }

ckv_status ckv_grammar_matcher_init(ckv_grammar_matcher *m, const ckv_grammar *g, const ckv_grammar_vocab *gv) {
    memset(m, 0, sizeof *m);
    m->g = g;
    m->gv = gv;
    m->cap = ARENA_NODES;
    m->max_depth = gv ? gv->all.max_depth : 0;
    size_t levels = (size_t)m->max_depth + 3; /* the current state, one per trie depth, a saved copy */
    ckv_status st = ckv_alloc((void **)&m->nodes, sizeof *m->nodes * m->cap, "grammar stacks");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&m->spare, sizeof *m->spare * m->cap, "grammar stacks (compaction)");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&m->moved, sizeof *m->moved * m->cap, "grammar compaction map");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&m->tops, sizeof *m->tops * CKV_GRAMMAR_MAX_TOPS * levels, "grammar states");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&m->n_tops, sizeof *m->n_tops * levels, "grammar state sizes");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&m->accept, levels, "grammar completions");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&m->mark, sizeof *m->mark * levels, "grammar marks");
    if (st != CKV_STATUS_OK) {
        ckv_grammar_matcher_free(m);
        return st;
    }
    ckv_grammar_matcher_reset(m);
    return CKV_STATUS_OK;
}

void ckv_grammar_matcher_free(ckv_grammar_matcher *m) {
    if (!m) return;
    ckv_free(m->nodes);
    ckv_free(m->spare);
    ckv_free(m->moved);
    ckv_free(m->tops);
    ckv_free(m->n_tops);
    ckv_free(m->accept);
    ckv_free(m->mark);
    memset(m, 0, sizeof *m);
}

void ckv_grammar_matcher_reset(ckv_grammar_matcher *m) {
    const ckv_grammar *g = m->g;
    m->n_nodes = 0;
    m->failed = 0;
    state_out o = {.tops = level(m, 0), .budget = SETTLE_BUDGET};
    for (uint32_t a = g->rule_off[0]; a < g->rule_off[1]; a++) settle(m, &o, g->alts[a], -1, 0, 0);
    m->n_tops[0] = o.n;
    m->accept[0] = (uint8_t)o.acc;
    m->mark[0] = m->n_nodes;
}

int ckv_grammar_matcher_complete(const ckv_grammar_matcher *m) { return m->accept[0]; }
int ckv_grammar_matcher_finished(const ckv_grammar_matcher *m) { return m->accept[0] && m->n_tops[0] == 0; }

/* Keeps only the nodes the current stacks reach (after a token), renumbered from 0. */
static void compact(ckv_grammar_matcher *m) {
    for (uint32_t i = 0; i < m->n_nodes; i++) m->moved[i] = -1;
    uint32_t n = 0, *tops = level(m, 0);
    for (int t = 0; t < m->n_tops[0]; t++) {
        /* copy the chain bottom-up: find the deepest unmoved node first */
        int32_t chain[CKV_GRAMMAR_MAX_NEST + 2];
        int k = 0;
        for (int32_t x = (int32_t)tops[t]; x >= 0 && m->moved[x] < 0 && k < CKV_GRAMMAR_MAX_NEST + 2; x = m->nodes[x].parent)
            chain[k++] = x;
        while (k > 0) {
            int32_t x = chain[--k];
            ckv_grammar_node nd = m->nodes[x];
            if (nd.parent >= 0) nd.parent = m->moved[nd.parent];
            m->spare[n] = nd;
            m->moved[x] = (int32_t)n++;
        }
        tops[t] = (uint32_t)m->moved[tops[t]];
    }
    ckv_grammar_node *swap = m->nodes;
    m->nodes = m->spare;
    m->spare = swap;
    m->n_nodes = n;
    m->mark[0] = n;
}

int ckv_grammar_matcher_accept_bytes(ckv_grammar_matcher *m, const uint8_t *bytes, size_t len) {
    const int save = m->max_depth + 2; /* the state before, restored when a byte is refused */
    uint32_t n_before = m->n_nodes;
    int n0 = m->n_tops[0], acc0 = m->accept[0];
    memcpy(level(m, save), level(m, 0), sizeof(uint32_t) * (size_t)n0);
    for (size_t i = 0; i < len; i++) {
        state_out o = {.tops = level(m, 1)};
        advance(m, level(m, 0), m->n_tops[0], bytes[i], &o);
        if (o.n == 0 && !(o.acc && i + 1 == len)) {
            memcpy(level(m, 0), level(m, save), sizeof(uint32_t) * (size_t)n0);
            m->n_tops[0] = n0;
            m->accept[0] = (uint8_t)acc0;
            m->n_nodes = n_before;
            m->mark[0] = n_before;
            return 0;
        }
        memcpy(level(m, 0), o.tops, sizeof(uint32_t) * (size_t)o.n);
        m->n_tops[0] = o.n;
        m->accept[0] = (uint8_t)o.acc;
    }
    compact(m);
    return 1;
}

int ckv_grammar_matcher_accept(ckv_grammar_matcher *m, int32_t t) {
    const ckv_grammar_vocab *gv = m->gv;
    if (t < 0 || t >= gv->vocab || gv->off[t + 1] == gv->off[t] ||
        !ckv_grammar_matcher_accept_bytes(m, gv->bytes + gv->off[t], gv->off[t + 1] - gv->off[t])) {
        m->failed = 1;
        return 0;
    }
    return 1;
}

/* Inside a JSON string: the room left (characters) for plain tokens, else -1 (walk every token).
 * Plain tokens are then allowed without a walk: all of them when a string body has room for the
 * longest (whatever else the other stacks accept, the union holds them), else those that fit, which
 * is exact only when no other stack can start plain content. */
static long long plain_room(const ckv_grammar_matcher *m, long long longest) {
    const ckv_grammar *g = m->g;
    const uint32_t *tops = m->tops;
    for (int i = 0; i < m->n_tops[0]; i++) {
        const ckv_grammar_node *nd = &m->nodes[tops[i]];
        const ckv_grammar_el *e = &g->els[nd->pos];
        if (e->kind == CKV_GEL_STR && CKV_STR_SUB(nd->aux) == 0 &&
            (e->hi == CKV_GRAMMAR_UNBOUNDED || (long long)e->hi - CKV_STR_COUNT(nd->aux) >= longest))
            return 1ll << 40;
    }
    long long room = -1;
    for (int i = 0; i < m->n_tops[0]; i++) {
        const ckv_grammar_node *nd = &m->nodes[tops[i]];
        const ckv_grammar_el *e = &g->els[nd->pos];
        if (e->kind == CKV_GEL_STR) {
            if (CKV_STR_SUB(nd->aux) != 0) return -1;
            long long r = e->hi == CKV_GRAMMAR_UNBOUNDED ? 1ll << 40 : (long long)e->hi - CKV_STR_COUNT(nd->aux);
            if (r > room) room = r;
        } else if (e->kind == CKV_GEL_BYTE) {
            uint8_t c = e->byte;
            if (c != '"' && c != '\\' && c >= 0x20 && !(c >= 0x80 && c < 0xC2) && c <= 0xF4) return -1;
        } else if (e->kind == CKV_GEL_CLASS && g->class_plain[e->arg]) {
            return -1;
        }
    }
    return room;
}

static int allow(const ckv_grammar_vocab *gv, int32_t t, uint8_t *allowed) {
    int n = 0;
    for (; t >= 0; t = gv->same[t])
        if (!allowed[t]) allowed[t] = 1, n++;
    return n;
}

int ckv_grammar_matcher_mask(ckv_grammar_matcher *m, const int32_t *eos, int n_eos, uint8_t *allowed) {
    const ckv_grammar_vocab *gv = m->gv;
    const long long longest = gv->n_plain > 0 ? gv->plain_chars[gv->n_plain - 1] : 0;
    const long long room = m->n_tops[0] ? plain_room(m, longest) : -1;
    int n = 0;
    if (room >= 0 && gv->n_plain > 0 && room >= longest) { /* every plain token fits */
        memcpy(allowed, gv->plain_mask, (size_t)gv->vocab);
        n = gv->n_plain;
    } else {
        memset(allowed, 0, (size_t)gv->vocab);
        for (int k = 0; room >= 0 && k < gv->n_plain && gv->plain_chars[k] <= room; k++) n += allow(gv, gv->plain[k], allowed);
    }
    if (m->accept[0])
        for (int i = 0; i < n_eos; i++)
            if (eos[i] >= 0 && eos[i] < gv->vocab && !allowed[eos[i]]) allowed[eos[i]] = 1, n++;
    if (m->n_tops[0] == 0) return n;
    const ckv_grammar_trie *tr = room >= 0 ? &gv->nonplain : &gv->all;
    m->mark[0] = m->n_nodes;
    for (uint32_t i = 0; i < tr->n;) {
        int d = tr->depth[i];
        m->n_nodes = m->mark[d - 1];
        state_out o = {.tops = level(m, d)};
        advance(m, level(m, d - 1), m->n_tops[d - 1], tr->byte[i], &o);
        m->n_tops[d] = o.n;
        m->mark[d] = m->n_nodes;
        if (o.n == 0 && !o.acc) {
            i = tr->skip[i];
            continue;
        }
        if (tr->token[i] >= 0) n += allow(gv, tr->token[i], allowed);
        i = o.n == 0 ? tr->skip[i] : i + 1;
    }
    m->n_nodes = m->mark[0];
    return n;
}
