/* text.h - the text side of a model: opens the tokenizer that belongs to a model path (a Hugging
 * Face directory's tokenizer.json + tokenizer_config.json, or the vocabulary inside a GGUF file)
 * and renders prompts with the model's chat template. It knows file locations, not tokenisation
 * (src/tokenizer) nor the forward pass. */
#ifndef CKV_ENGINE_TEXT_H
#define CKV_ENGINE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

/* Opens the tokenizer of `model_path`: a model directory (its tokenizer.json), a GGUF file (its
 * tokenizer.ggml.* metadata), or a tokenizer.json file under any name. Errors name the file. */
ckv_status ckv_text_open_tokenizer(ckv_tokenizer **out, const char *model_path);

enum {
    CKV_TEXT_CHAT = 1u << 0,               /* render the prompt as a user turn in a chat template */
    CKV_TEXT_SPECIAL_IN_CONTENT = 1u << 1  /* with CKV_TEXT_CHAT: special-token strings in the context,
                                              question and system text become special tokens (by default
                                              they are plain text; only the template's markers are special) */
};

/* Encodes a context and (optionally) a question the way kvpress's pipeline splits them: the prompt
 * is rendered as one user turn `context + question` (with CKV_TEXT_CHAT in flags, in the template
 * `template_name`, NULL = the tokenizer's own, with an optional system turn and the assistant header;
 * without, as plain text with the tokenizer's BOS where it wants one, special-token strings
 * recognised as a raw prompt's are); the context ids are everything up to the end of the context,
 * the question ids the rest (the question, the end of the turn and the assistant header).
 * question = NULL: everything is context. Both arrays are malloc'd. */
ckv_status ckv_text_encode_split(const ckv_tokenizer *tok, const char *context, const char *question, unsigned flags,
                                 const char *template_name, const char *system, int32_t **ctx_ids, int *n_ctx,
                                 int32_t **q_ids, int *n_q);

#endif
