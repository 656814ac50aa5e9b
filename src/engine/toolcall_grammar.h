/* toolcall_grammar.h - tool_choice "required" and a named function as a grammar for the constrained
 * decoder (grammar.h): the answer is the syntax's exact call text (toolcall.h: c_first, then per call
 * c_open + one of the allowed names + c_mid + the arguments + c_close, c_sep between calls when
 * parallel, c_last), then it ends. Each function's arguments follow its parameters schema (strict:
 * OpenAI's structured-output rules); a non-strict schema the compiler does not support falls back to
 * any JSON object (reported in *n_loose). Built with grammar.h's rule builder; the result is an
 * ordinary ckv_grammar the logits processing masks with. It does not parse answers (toolcall.h) or
 * read requests. */
#ifndef CKV_TOOLCALL_GRAMMAR_H
#define CKV_TOOLCALL_GRAMMAR_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "engine/grammar.h"
#include "engine/toolcall.h"

typedef struct {
    const char *name;        /* [A-Za-z0-9_-]{1,64} */
    const cJSON *parameters; /* a JSON schema of the arguments (NULL: any object) */
    int strict;
} ckv_toolcall_fn;

/* The grammar of calls to fns [n] (several, one after another, when parallel; one otherwise). A
 * strict schema that fails to compile fails with CKV_STATUS_ERR_ARG, err naming the function and the
 * keyword; *n_loose counts the non-strict ones that fell back to any object. g needs
 * ckv_grammar_free either way. */
ckv_status ckv_toolcall_grammar_init(ckv_grammar *g, const ckv_toolcall_syntax *syn, const ckv_toolcall_fn *fns, int n, int parallel,
                                     int *n_loose, char *err, size_t errlen);

#endif
