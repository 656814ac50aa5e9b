/* toolcall_grammar.c - the grammar of forced tool calls (see toolcall_grammar.h), written through the
 * grammar's rule builder (grammar_impl.h) as root ::= c_first call (c_sep call)* c_last and
 * call ::= c_open name_1 c_mid args_1 c_close | ... */
#include "engine/toolcall_grammar.h"

#include <stdio.h>
#include <string.h>

#include "engine/grammar_impl.h"

static void lit(ckv_gb *b, const char *s) { ckv_gb_lit(b, s, strlen(s)); }

ckv_status ckv_toolcall_grammar_init(ckv_grammar *g, const ckv_toolcall_syntax *syn, const ckv_toolcall_fn *fns, int n, int parallel,
                                     int *n_loose, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    *n_loose = 0;
    if (!syn || n < 1) return ckv_error(CKV_STATUS_ERR_ARG, "tool_choice: no function to call");
    /* which schemas compile (a non-strict one that does not: any object) */
    int loose[128];
    if (n > 128) return ckv_error(CKV_STATUS_ERR_ARG, "tool_choice: %d functions, at most 128", n);
    for (int i = 0; i < n; i++) {
        loose[i] = !fns[i].parameters;
        if (loose[i]) continue;
        ckv_grammar t;
        char msg[256];
        ckv_status st = ckv_grammar_init_schema(&t, fns[i].parameters, fns[i].strict, msg, sizeof msg);
        ckv_grammar_free(&t);
        if (st == CKV_STATUS_OK) continue;
        if (fns[i].strict) {
            snprintf(err, errlen, "function '%s': parameters %s", fns[i].name, msg);
            return st;
        }
        ckv_error_clear();
        loose[i] = 1;
        ++*n_loose;
    }
    ckv_gb b;
    ckv_gb_init(&b, g);
    int root = ckv_gb_rule(&b), call = ckv_gb_rule(&b), failed = 0;
    for (int i = 0; i < n && !failed; i++) {
        ckv_gb_begin(&b);
        lit(&b, syn->c_open);
        lit(&b, fns[i].name);
        lit(&b, syn->c_mid);
        if (loose[i]) ckv_gb_ref(&b, ckv_gb_json_object(&b));
        else failed = ckv_gb_schema(&b, fns[i].parameters, fns[i].strict, err, errlen) != 0;
        lit(&b, syn->c_close);
        ckv_gb_end(&b, call);
    }
    ckv_gb_begin(&b);
    lit(&b, syn->c_first);
    ckv_gb_ref(&b, call);
    if (parallel) {
        int more = ckv_gb_rule(&b);
        ckv_gb_begin(&b);
        lit(&b, syn->c_sep);
        ckv_gb_ref(&b, call);
        ckv_gb_end(&b, more);
        ckv_gb_repeat(&b, (ckv_grammar_el){.kind = CKV_GEL_REF, .arg = (uint32_t)more}, 0, CKV_GRAMMAR_UNBOUNDED);
    }
    lit(&b, syn->c_last);
    ckv_gb_end(&b, root);
    ckv_status st = failed ? ckv_error(CKV_STATUS_ERR_ARG, "%s", err) : ckv_gb_finish(&b, err, errlen);
    ckv_gb_free(&b);
    return st;
}
