/* srv_fields.h - reading a request's fields for srv_api.c: typed readers that leave *out alone when
 * the field is absent or null and fill an OpenAI-style error naming it otherwise (0 ok, -1 error), and
 * the groups of fields beside the prompt and the press. Internal to src/server. */
#ifndef CKV_SRV_FIELDS_H
#define CKV_SRV_FIELDS_H

#include <cjson/cJSON.h>

#include "evict/press.h"
#include "server/srv_api.h"

int ckv_srv_bad_type(ckv_srv_error *err, const char *field, const char *want); /* always -1 */
int ckv_srv_get_number(const cJSON *o, const char *field, double lo, double hi, double *out, ckv_srv_error *err);
int ckv_srv_get_int(const cJSON *o, const char *field, double lo, double hi, long long *out, ckv_srv_error *err);
int ckv_srv_get_bool(const cJSON *o, const char *field, int *out, ckv_srv_error *err);
int ckv_srv_get_string(const cJSON *o, const char *field, const char **out, ckv_srv_error *err);

/* A press's options given as a JSON object ("press_options": {"window": 32, "compression_ratios":
 * [0.25, 0.5]}): each member as the text ckv_press_set_option reads (numbers, booleans as 1 / 0,
 * strings, arrays of numbers comma-joined); keys point into the request, values into `text` (heap,
 * freed by ckv_srv_press_options_free, which accepts a zeroed or partial object). */
enum { CKV_SRV_MAX_PRESS_OPTIONS = 16 };
typedef struct {
    ckv_press_option_value v[CKV_SRV_MAX_PRESS_OPTIONS];
    int n;
    char *text;
} ckv_srv_press_options;
int ckv_srv_get_press_options(const cJSON *o, const char *field, ckv_srv_press_options *out, ckv_srv_error *err);
void ckv_srv_press_options_free(ckv_srv_press_options *po);

/* Refuses a field the endpoint does not know (as OpenAI does: 400 naming it). */
int ckv_srv_known_fields(const cJSON *o, ckv_srv_kind kind, ckv_srv_error *err);
/* frequency/presence/repetition penalties, min_p, logit_bias into j; best_of other than n and a
 * non-empty suffix refused. */
int ckv_srv_sampling_fields(const ckv_srv_api *a, const cJSON *o, ckv_srv_kind kind, long long n, ckv_srv_job *j,
                            ckv_srv_error *err);
/* response_format (chat: text, json_object, json_schema) and the "grammar" extension (both endpoints)
 * compiled into j->grammar (j->logits.grammar points at it). */
int ckv_srv_format_fields(const cJSON *o, ckv_srv_kind kind, ckv_srv_job *j, ckv_srv_error *err);
/* tools, tool_choice and parallel_tool_calls (chat): checked against the template (400 naming
 * "tools" when it takes none), j->tool_syntax set unless tool_choice is "none", the constrained
 * decoder for "required" or a named function; functions / function_call refused. */
int ckv_srv_tool_fields(const ckv_srv_api *a, const cJSON *o, ckv_srv_kind kind, ckv_srv_job *j, ckv_srv_error *err);
/* The tool parts of chat message i of role `role`: *calls the assistant's tool_calls (NULL: none);
 * a tool message's tool_call_id. */
int ckv_srv_message_tools(const cJSON *msg, int i, const char *role, const cJSON **calls, ckv_srv_error *err);
/* logprobs (completions: the legacy integer; chat: a boolean with top_logprobs) and echo. */
int ckv_srv_logprob_fields(const cJSON *o, ckv_srv_kind kind, int *want, int *top, int *echo, ckv_srv_error *err);
/* Echo: the echoed ids and text; with logprobs a question holding them so that each gets its row of
 * logits (without "context" the prompt's first token becomes the context, the rest the question). */
int ckv_srv_echo_setup(const ckv_srv_api *a, ckv_srv_job *j, int with_logprobs, ckv_srv_error *err);

#endif
