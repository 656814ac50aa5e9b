/* cmd_tokenize.c - `ckv tokenize`: text -> token ids (or ids -> text with --decode) with a model's
 * tokenizer (a directory holding tokenizer.json, the tokenizer.json file itself, or a GGUF file), optionally
 * wrapped as one user turn of the model's chat template. Prints the ids on one line separated by
 * spaces; with --decode prints the text exactly (no newline added). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/json.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "comm/comm.h"
#include "engine/text.h"
#include "tokenizer/tokenizer.h"

static const ckv_cli_command tokenize_cmd = {
    CKV_CMD_TOKENIZE, "tokenize", "-m PATH [--text T | < stdin] [flags]",
    "Prints the token ids of the text on one line (or, with --decode, the text of the ids exactly)."};

/* stdin, whole, up to the input limit (CKV_MAX_INPUT_BYTES): an endless stream ends with an error. */
static char *read_stdin(size_t *len) {
    size_t limit = 0;
    char *buf = NULL;
    ckv_cli_check(ckv_input_limit(&limit));
    ckv_cli_check(ckv_read_stream(stdin, "stdin", limit, &buf, len));
    return buf;
}

int ckv_cmd_tokenize(int argc, char **argv) {
    ckv_opts o;
    ckv_opts_parse(&o, &tokenize_cmd, argc, argv);
    const char *model = ckv_opt_str(&o, CKV_OPT_MODEL, NULL), *text = ckv_opt_str(&o, CKV_OPT_TEXT, NULL);
    const char *template_name = ckv_opt_str(&o, CKV_OPT_TEMPLATE, NULL), *system = ckv_opt_str(&o, CKV_OPT_SYSTEM, NULL);
    static const ckv_opt_id special[] = {CKV_OPT_ADD_SPECIAL, CKV_OPT_NO_SPECIAL};
    ckv_opts_exclusive(&o, special, 2, "contradict each other");
    int decode = ckv_opt_has(&o, CKV_OPT_DECODE), add_special = !ckv_opt_has(&o, CKV_OPT_NO_SPECIAL);
    int split_special = ckv_opt_has(&o, CKV_OPT_SPLIT_SPECIAL), skip_special = ckv_opt_has(&o, CKV_OPT_SKIP_SPECIAL);
    int utf8_replace = ckv_opt_has(&o, CKV_OPT_UTF8_REPLACE), chat = ckv_opt_has(&o, CKV_OPT_CHAT);
    int special_in_content = ckv_opt_has(&o, CKV_OPT_SPECIAL_IN_CONTENT);
    int count = ckv_opt_has(&o, CKV_OPT_COUNT);
    ckv_cli_agreement ag; /* one process; under mpirun every rank must run the same */
    ckv_cli_agree_init(&ag, &o, model);
    if (ckv_comm_launched_by_mpi()) ckv_comm_free(ckv_cli_world(&ag, &argc, &argv));
    if (!model) ckv_cli_usage_error("tokenize", "--model is required");
    if (decode && chat) ckv_cli_usage_error("tokenize", "--decode and --chat cannot be combined");
    if (special_in_content && !chat) ckv_cli_usage_error("tokenize", "--special-in-content needs --chat");
    ckv_tokenizer *tok = NULL;
    ckv_cli_check(ckv_text_open_tokenizer(&tok, model));

    char *owned = NULL;
    size_t len;
    if (text) {
        len = strlen(text);
    } else {
        owned = read_stdin(&len);
        text = owned;
    }

    if (decode) {
        int n = 0;
        int32_t *ids = ckv_cli_parse_ids(text, &n, "token ids");
        char *out = NULL;
        size_t olen = 0;
        ckv_cli_check(ckv_tokenizer_decode(tok, ids, (size_t)n, skip_special ? CKV_DETOKENIZE_SKIP_SPECIAL : 0, &out,
                                           &olen));
        fwrite(out, 1, olen, stdout);
        free(out);
        free(ids);
    } else {
        char *prompt = NULL;
        ckv_text_range *plain = NULL; /* [n_plain] the messages' text in the rendered chat */
        size_t n_plain = 0;
        unsigned flags = (add_special && !chat ? CKV_TOKENIZE_ADD_SPECIAL : 0) |
                         (split_special ? CKV_TOKENIZE_SPLIT_SPECIAL : 0) |
                         (utf8_replace ? CKV_TOKENIZE_UTF8_REPLACE : 0);
        if (chat) {
            ckv_chat_template ct = *ckv_tokenizer_chat_template(tok);
            if (template_name) ckv_cli_check(ckv_chat_template_by_name(template_name, &ct));
            if (ct.family == CKV_CHAT_NONE && !template_name)
                ckv_cli_die("%s: the tokenizer has no recognised chat template; choose one with --template", model);
            if (memchr(text, '\0', len)) ckv_cli_die("--chat: the text contains a NUL byte");
            ckv_chat_message msgs[2];
            int nm = 0;
            if (system) msgs[nm++] = (ckv_chat_message){"system", system};
            msgs[nm++] = (ckv_chat_message){"user", text};
            ckv_cli_check(ckv_chat_apply_ranges(&ct, msgs, nm, 1, &prompt, &plain, &n_plain));
            if (special_in_content) n_plain = 0; /* else the messages' text is plain: only the template's markers are special */
            text = prompt;
            len = strlen(prompt);
        } else if (template_name) {
            ckv_cli_usage_error("tokenize", "--template needs --chat");
        }
        int32_t *ids = NULL;
        size_t n = 0;
        ckv_status s = ckv_tokenizer_encode_ranges(tok, text, len, flags, SIZE_MAX, plain, n_plain, &ids, &n);
        if (s == CKV_STATUS_ERR_FORMAT && !utf8_replace) /* the input text's bytes */
            ckv_cli_die("%s (--utf8-replace turns invalid bytes into U+FFFD)", ckv_error_message());
        ckv_cli_check(s);
        if (count) {
            printf("%zu\n", n);
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
            printf("\n");
        }
        free(ids);
        free(prompt);
        free(plain);
    }
    free(owned);
    ckv_tokenizer_free(tok);
    if (fflush(stdout) != 0) ckv_cli_die("cannot write to stdout");
    return 0;
}
