/* srv_api.h - the OpenAI-compatible JSON side of `ckv serve`: validates request bodies of
 * /v1/completions, /v1/chat/completions, /tokenize and /detokenize (every bad field becomes an
 * OpenAI-style error naming it), turns prompts into context + question ids (see below), and writes
 * responses, stream chunks, error objects and the model list (srv_response.c), all through cJSON. It
 * does not do HTTP (srv_http.c) or run the model (srv_sched.c).
 *
 * What the "context" of a request is (the part compressed once and reused): for completions, the
 * extension field "context" (text or token ids) when given, with "prompt" as the question; else the
 * whole prompt. For chat, the extension field "context" (text, rendered as kvpress does: one user
 * turn "context + question" of which the context part is compressed), else everything the template
 * renders before the last user message (system prompt and earlier turns); when that is empty, the
 * whole conversation. With "query_aware": true the question joins the context. */
#ifndef CKV_SRV_API_H
#define CKV_SRV_API_H

#include <stddef.h>

#include "server/server.h"
#include "server/srv_job.h"

typedef struct {
    int http;                /* 4xx / 5xx */
    const char *type;        /* "invalid_request_error", "authentication_error", ... */
    const char *code;        /* NULL or e.g. "context_length_exceeded" */
    char param[64];          /* the field at fault ("" : none) */
    char message[512];
} ckv_srv_error;

typedef struct {
    ckv_engine *engine;
    const ckv_tokenizer *tok;
    const ckv_server_config *cfg;
    ckv_chat_template tmpl;  /* family NONE: the model has no chat template */
    size_t piece_cap;
    int max_prompt;          /* effective prompt-token limit */
} ckv_srv_api;

ckv_status ckv_srv_api_init(ckv_srv_api *a, ckv_engine *e, const ckv_server_config *cfg, size_t piece_cap);

void ckv_srv_error_set(ckv_srv_error *e, int http, const char *type, const char *param, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* Parses a completion or chat body into jobs ready to submit: one, or one per prompt of a list of
 * prompts in /v1/completions (at most cap; they share the response id); 0 with *n_out jobs in
 * out[], or -1 with *err filled (and no job). */
int ckv_srv_api_parse(const ckv_srv_api *a, ckv_srv_kind kind, const char *body, size_t len, ckv_srv_job **out, int cap,
                      int *n_out, ckv_srv_error *err);

struct cJSON;
/* Prints o as compact JSON (malloc'd; NULL when o is NULL or out of memory) and deletes it. */
char *ckv_srv_json_print(struct cJSON *o);

/* Response bodies (malloc'd JSON text, NULL when out of memory; srv_response.c). */
char *ckv_srv_api_error_json(const ckv_srv_error *e);
/* The whole response of jobs [n] (a list of prompts: choice indices prompt * n + c, usage summed);
 * takes each job's mu. */
char *ckv_srv_api_response(const ckv_srv_api *a, ckv_srv_job *const *jobs, int n);
/* GET /v1/models/{id}: the model object, or NULL with *err filled (404). */
char *ckv_srv_api_model(const ckv_srv_api *a, const char *id, ckv_srv_error *err);
/* One stream chunk: `delta` [n] of choice c (role: chat's first chunk carries the role), finish
 * (NONE while running). */
char *ckv_srv_api_chunk(const ckv_srv_api *a, const ckv_srv_job *j, int c, const char *delta, size_t n, int role,
                        ckv_finish_reason finish);
char *ckv_srv_api_usage_chunk(const ckv_srv_api *a, ckv_srv_job *j);  /* takes j->mu */
char *ckv_srv_api_models(const ckv_srv_api *a);
/* /tokenize and /detokenize: the response body, or NULL with *err filled. */
char *ckv_srv_api_tokenize(const ckv_srv_api *a, const char *body, size_t len, ckv_srv_error *err);
char *ckv_srv_api_detokenize(const ckv_srv_api *a, const char *body, size_t len, ckv_srv_error *err);

#endif
