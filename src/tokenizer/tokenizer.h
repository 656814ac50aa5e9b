/* tokenizer.h - text <-> token ids, the way Hugging Face `tokenizers` does it, for the model
 * families ckv runs (Llama 3.x, Qwen2.5, Mistral v0.3, SmolLM2):
 *  - loading a tokenizer.json (model BPE: byte-level with regex pre-tokenizers, or SentencePiece
 *    style with byte fallback and metaspace), plus tokenizer_config.json beside it when present
 *    (chat template, bos/eos);
 *  - loading a vocabulary handed over from GGUF metadata (gpt2-style BPE with merges, or
 *    llama/SentencePiece style with scores) through the plain-data ckv_tokenizer_gguf_vocab;
 *  - encode (added/special tokens, normalizers, pre-tokenizers, BPE, post-processor), decode, a
 *    streaming decoder that holds back incomplete UTF-8, token_to_piece, special-token look-up;
 *  - chat templates of three families (Llama-3 headers, ChatML, Mistral [INST]).
 * It does not read GGUF files (src/model does and fills ckv_tokenizer_gguf_vocab), train
 * tokenizers, or run Jinja: templates are recognised by their markers and rendered in C.
 * A loaded tokenizer is immutable: encode/decode may run concurrently on one tokenizer. */
#ifndef CKV_TOKENIZER_H
#define CKV_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct ckv_tokenizer ckv_tokenizer;

/* ---- loading ---------------------------------------------------------------------------------- */

/* Loads `path`: a tokenizer.json file, or a directory holding tokenizer.json (and optionally
 * tokenizer_config.json, read for chat_template, bos/eos tokens and add_bos_token). Errors name the
 * file and the unsupported or malformed part (e.g. "model type 'Unigram' is not supported"). */
ckv_status ckv_tokenizer_load_json(ckv_tokenizer **out, const char *path);

/* Same from a tokenizer.json held in memory; `config_json` (tokenizer_config.json text) may be NULL.
 * `what` names the source in errors. */
ckv_status ckv_tokenizer_load_json_buffer(ckv_tokenizer **out, const char *json, size_t len,
                                          const char *config_json, size_t config_len, const char *what);

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    CKV_GGUF_TOKEN_NORMAL = 1,
    CKV_GGUF_TOKEN_UNKNOWN = 2,
    CKV_GGUF_TOKEN_CONTROL = 3,
    CKV_GGUF_TOKEN_USER_DEFINED = 4,
    CKV_GGUF_TOKEN_UNUSED = 5,
    CKV_GGUF_TOKEN_BYTE = 6
};

/* The tokenizer part of a GGUF file's metadata, as plain arrays the caller owns (they are copied).
 * Strings need not be NUL-terminated: lengths are given. */
typedef struct {
    const char *model;             /* tokenizer.ggml.model: "gpt2" or "llama" */
    const char *pre;               /* tokenizer.ggml.pre (gpt2 only): "llama-bpe", "qwen2", "smollm",
                                      "gpt2", "default"; NULL = "default" */
    int64_t n_tokens;              /* length of tokens/token_len (and scores/types when given) */
    const char *const *tokens;     /* [n_tokens] tokenizer.ggml.tokens */
    const uint64_t *token_len;     /* [n_tokens] byte lengths; NULL = NUL-terminated strings */
    const float *scores;           /* [n_tokens] tokenizer.ggml.scores; required for "llama" */
    const int32_t *types;          /* [n_tokens] tokenizer.ggml.token_type; NULL = all normal */
    int64_t n_merges;              /* gpt2 only */
    const char *const *merges;     /* [n_merges] "left right" */
    const uint64_t *merge_len;     /* [n_merges] byte lengths; NULL = NUL-terminated */
    int64_t bos_id, eos_id, unk_id, pad_id, eot_id; /* -1 when absent */
    int add_bos;                   /* tokenizer.ggml.add_bos_token: 1, 0, or -1 when absent */
    int add_eos;                   /* tokenizer.ggml.add_eos_token: 1, 0, or -1 when absent */
    int add_space_prefix;          /* tokenizer.ggml.add_space_prefix (llama): 1, 0, or -1 */
    const char *chat_template;     /* tokenizer.chat_template or NULL */
    uint64_t chat_template_len;    /* 0 = NUL-terminated */
} ckv_tokenizer_gguf_vocab;

/* Builds a tokenizer from GGUF metadata arrays. Errors name the unsupported model or pre-tokenizer,
 * or the bad token/merge index. */
ckv_status ckv_tokenizer_load_gguf_vocab(ckv_tokenizer **out, const ckv_tokenizer_gguf_vocab *v);

void ckv_tokenizer_free(ckv_tokenizer *tok); /* NULL is fine */

/* ---- encoding --------------------------------------------------------------------------------- */

enum {
    /* Run the post-processor (tokenizer.json TemplateProcessing, e.g. a leading <|begin_of_text|>,
     * or add_bos_token for GGUF): HF's add_special_tokens=True. */
    CKV_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* Do not recognise special added tokens in the text (HF's split_special_tokens): "<|eot_id|>"
     * is then tokenized as ordinary text. Non-special added tokens are still recognised. */
    CKV_TOKENIZE_SPLIT_SPECIAL = 1u << 1,
    /* Replace invalid UTF-8 with U+FFFD (like Python's bytes.decode(errors="replace")) instead of
     * failing with CKV_STATUS_ERR_FORMAT naming the byte offset. */
    CKV_TOKENIZE_UTF8_REPLACE = 1u << 2
};

/* Encodes `len` bytes of UTF-8 text into *ids (malloc'd, free with free(); NULL when *n_ids is 0).
 * Invalid UTF-8: an error naming the offset unless CKV_TOKENIZE_UTF8_REPLACE. */
ckv_status ckv_tokenizer_encode(const ckv_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                int32_t **ids, size_t *n_ids);
/* The same, but stops once more than max_ids ids came out: then *n_ids is max_ids + 1 and the text
 * after them was not encoded (for callers that refuse a text over max_ids tokens anyway: the work is
 * bounded by the limit, not by the text). */
ckv_status ckv_tokenizer_encode_max(const ckv_tokenizer *tok, const char *text, size_t len, unsigned flags, size_t max_ids,
                                    int32_t **ids, size_t *n_ids);

/* A byte range [off, off + len) of a text. */
typedef struct {
    size_t off, len;
} ckv_text_range;

/* ckv_tokenizer_encode_max where special added tokens are recognised only outside the plain ranges
 * (sorted, disjoint): in a rendered chat the messages' content is plain text, so "<|im_start|>"
 * typed by a user stays text while the template's own markers become special tokens (what
 * tiktoken's disallowed_special does for input). Invalid UTF-8 is always an error here. */
ckv_status ckv_tokenizer_encode_ranges(const ckv_tokenizer *tok, const char *text, size_t len, unsigned flags, size_t max_ids,
                                       const ckv_text_range *plain, size_t n_plain, int32_t **ids, size_t *n_ids);

/* ---- decoding --------------------------------------------------------------------------------- */

enum {
    CKV_DETOKENIZE_SKIP_SPECIAL = 1u << 0 /* drop special tokens (HF skip_special_tokens=True) */
};

/* Decodes ids into NUL-terminated UTF-8 text (*text malloc'd; *len excludes the NUL). Invalid byte
 * sequences become U+FFFD as HF does. An id outside the vocabulary is an error naming it. */
ckv_status ckv_tokenizer_decode(const ckv_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                                char **text, size_t *len);

/* Streaming decoder for generation: feed ids one at a time, get the text that is final so far.
 * Incomplete UTF-8 (and, for byte-fallback vocabularies, a run of <0xXX> tokens) is held back until
 * it completes. The concatenation of everything returned, plus the flush, equals
 * ckv_tokenizer_decode of all the ids. No allocation after init. */
typedef struct {
    const ckv_tokenizer *tok;
    unsigned flags;
    int n_tokens;          /* tokens seen (first-token rules) */
    int strip_left;        /* leading strip characters still to remove */
    int strip_done;
    int pending_is_run;    /* pending holds a run of byte-fallback tokens */
    size_t pending_len;    /* held-back bytes */
    uint8_t pending[256];
} ckv_detok_stream;

void ckv_detok_stream_init(ckv_detok_stream *s, const ckv_tokenizer *tok, unsigned flags);
/* Writes the text that became final after `id` to out (capacity `cap`, always NUL-terminated),
 * *n_out = bytes written. cap >= ckv_detok_stream_cap(tok) always suffices. */
ckv_status ckv_detok_stream_push(ckv_detok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out);
/* Emits whatever is held back (incomplete UTF-8 as U+FFFD). */
ckv_status ckv_detok_stream_flush(ckv_detok_stream *s, char *out, size_t cap, size_t *n_out);
/* An output capacity that always suffices for one push or the flush. */
size_t ckv_detok_stream_cap(const ckv_tokenizer *tok);

/* The raw bytes a token stands for (byte-level chars mapped back to bytes, "▁" -> " ", "<0x41>" ->
 * "A", added tokens as their text), without any first-token rule. Returns the byte length, or -1
 * for an id outside the vocabulary; writes at most cap bytes (no NUL). */
int ckv_tokenizer_token_to_piece(const ckv_tokenizer *tok, int32_t id, char *buf, size_t cap);
/* The vocabulary string of a token as stored (e.g. "Ġthe", "▁the", "<|eot_id|>"); NULL if none. */
const char *ckv_tokenizer_token_text(const ckv_tokenizer *tok, int32_t id);
size_t ckv_tokenizer_max_piece_bytes(const ckv_tokenizer *tok);

/* ---- vocabulary and special tokens ------------------------------------------------------------ */

int32_t ckv_tokenizer_vocab_size(const ckv_tokenizer *tok); /* max id + 1 */
/* Id of a token by its exact text (added tokens first, then the model vocabulary); -1 if absent. */
int32_t ckv_tokenizer_token_id(const ckv_tokenizer *tok, const char *text);
int ckv_tokenizer_is_special(const ckv_tokenizer *tok, int32_t id);
int32_t ckv_tokenizer_bos_id(const ckv_tokenizer *tok); /* -1 when none */
int32_t ckv_tokenizer_eos_id(const ckv_tokenizer *tok); /* -1 when none */
/* End-of-turn ids a generation loop should stop on (eos, <|eot_id|>, <|eom_id|>, <|im_end|>, </s>
 * when present), up to `cap`; returns how many. */
int ckv_tokenizer_stop_ids(const ckv_tokenizer *tok, int32_t *ids, int cap);

/* ---- chat templates --------------------------------------------------------------------------- */

typedef enum {
    CKV_CHAT_NONE = 0,   /* no template: text is used as is */
    CKV_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    CKV_CHAT_CHATML,     /* <|im_start|>role\n...<|im_end|>\n (Qwen2.5, SmolLM2) */
    CKV_CHAT_MISTRAL     /* <s>[INST] ...[/INST] (Mistral v0.3) */
} ckv_chat_family;

typedef struct {
    ckv_chat_family family;
    char name[32];              /* "llama3", "llama3.1", "llama3.2", "chatml", "qwen2.5", "smollm2", "mistral" */
    char default_system[4096];  /* system prompt used when the conversation has none ("" = none); a longer
                                 * literal in a template is an error, never cut */
    int llama31_preamble;       /* Llama 3.1+: system turn opens with the knowledge/today dates */
    int llama_date_today;       /* Llama 3.2 (template calls strftime_now): today's date, else 26 Jul 2024 */
    int mistral_space;          /* Mistral v0.1/v0.2 style "[INST] x [/INST]" (1) or v0.3 "[INST] x[/INST]" (0) */
    char tool_syntax[16];       /* the tool-call syntax the template renders and the model writes ("hermes":
                                 * Qwen2.5's <tools>/<tool_call>/<tool_response>); "" when it takes no tools */
} ckv_chat_template;

typedef struct {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* NULL only for an assistant message with tool calls (ckv_chat_apply_tools) */
} ckv_chat_message;
struct cJSON;

/* Recognises a Jinja chat template by its markers; CKV_STATUS_ERR_UNSUPPORTED naming what was
 * seen when it fits none of the families. */
ckv_status ckv_chat_template_detect(const char *jinja, ckv_chat_template *out);
/* By name ("llama3", "llama3.1", "llama3.2", "chatml", "qwen2.5", "smollm2", "mistral", "mistral-v0.1",
 * "none"). */
ckv_status ckv_chat_template_by_name(const char *name, ckv_chat_template *out);
/* The tokenizer's own template (from tokenizer_config.json / GGUF); family NONE when it has none. */
const ckv_chat_template *ckv_tokenizer_chat_template(const ckv_tokenizer *tok);
/* Renders messages into prompt text (*out malloc'd, NUL-terminated), with the assistant header
 * when add_generation_prompt. The text carries the special tokens (bos included where the family
 * puts it), so encode it WITHOUT CKV_TOKENIZE_ADD_SPECIAL. */
ckv_status ckv_chat_apply(const ckv_chat_template *t, const ckv_chat_message *msgs, int n_msgs,
                          int add_generation_prompt, char **out);
/* The same, also returning the ranges of *out that are the messages' content (*content malloc'd, free
 * with free(); sorted): encode with ckv_tokenizer_encode_ranges so that only the template's own
 * markers become special tokens. */
ckv_status ckv_chat_apply_ranges(const ckv_chat_template *t, const ckv_chat_message *msgs, int n_msgs, int add_generation_prompt,
                                 char **out, ckv_text_range **content, size_t *n_content);
/* The same with tools (OpenAI's "tools" array of {"type": "function", "function": {...}}, each
 * written as Jinja's tojson in transformers writes it: chat_template_json.c; NULL: none) and
 * messages that may carry tool calls (calls [n_msgs], NULL or entries NULL: none; else an assistant's
 * OpenAI array [{"type": "function", "function": {"name", "arguments"}}], arguments a JSON string or
 * object) or be tool results (role "tool"); CKV_STATUS_ERR_UNSUPPORTED naming "tools" when the
 * template takes none. Tool definitions, call arguments and results are content (plain text).
 * content may be NULL. */
ckv_status ckv_chat_apply_tools(const ckv_chat_template *t, const struct cJSON *tools, const ckv_chat_message *msgs,
                                const struct cJSON *const *calls, int n_msgs, int add_generation_prompt, char **out,
                                ckv_text_range **content, size_t *n_content);

#endif
