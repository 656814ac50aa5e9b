/* cmd_tokenize.c - `ckv tokenize`: text -> token ids (or ids -> text with --decode) with a model's
 * tokenizer (a directory holding tokenizer.json, the tokenizer.json file itself, or a GGUF file), optionally
 * wrapped as one user turn of the model's chat template. Prints the ids on one line separated by
 * spaces; with --decode prints the text exactly (no newline added). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/text.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ckv tokenize --model PATH [--text T | < stdin] [flags]\n"
            "\n"
            "  --model PATH       directory with tokenizer.json (and tokenizer_config.json), or a tokenizer.json\n"
            "  --text T           the text (default: all of stdin, byte for byte)\n"
            "  --decode           read token ids (spaces/commas) and print the text they decode to\n"
            "  --add-special      add the post-processor's tokens, e.g. a leading bos (default)\n"
            "  --no-special       do not add them\n"
            "  --split-special    treat special-token text such as <|eot_id|> as plain text\n"
            "  --skip-special     with --decode: leave special tokens out of the text\n"
            "  --utf8-replace     replace invalid UTF-8 in the input with U+FFFD instead of failing\n"
            "  --chat             wrap the text as one user turn with the model's chat template\n"
            "  --template NAME    chat template to use: llama3, llama3.1, llama3.2, chatml, qwen2.5, smollm2, mistral,\n"
            "                     mistral-v0.1, none (default: recognised from tokenizer_config.json)\n"
            "  --system T         with --chat: a system message first\n"
            "  --count            print only the number of tokens\n");
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) ckv_cli_die("out of memory reading stdin");
    for (;;) {
        if (n + 1 >= cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) ckv_cli_die("out of memory reading stdin");
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) ckv_cli_die("cannot read stdin");
    buf[n] = '\0';
    *len = n;
    return buf;
}

int ckv_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *template_name = NULL, *system = NULL;
    int decode = 0, add_special = 1, split_special = 0, skip_special = 0, utf8_replace = 0, chat = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            model = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(a, "--text")) {
            text = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(a, "--decode")) {
            decode = 1;
        } else if (!strcmp(a, "--add-special")) {
            add_special = 1;
        } else if (!strcmp(a, "--no-special")) {
            add_special = 0;
        } else if (!strcmp(a, "--split-special")) {
            split_special = 1;
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = 1;
        } else if (!strcmp(a, "--utf8-replace")) {
            utf8_replace = 1;
        } else if (!strcmp(a, "--chat")) {
            chat = 1;
        } else if (!strcmp(a, "--template")) {
            template_name = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(a, "--system")) {
            system = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(a, "--count")) {
            count = 1;
        } else {
            ckv_cli_usage_error("tokenize", "unknown flag '%s'", a);
        }
    }
    if (!model) ckv_cli_usage_error("tokenize", "--model is required");
    if (decode && chat) ckv_cli_usage_error("tokenize", "--decode and --chat cannot be combined");
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
            ckv_cli_check(ckv_chat_apply(&ct, msgs, nm, 1, &prompt));
            text = prompt;
            len = strlen(prompt);
        } else if (template_name) {
            ckv_cli_usage_error("tokenize", "--template needs --chat");
        }
        int32_t *ids = NULL;
        size_t n = 0;
        ckv_status s = ckv_tokenizer_encode(tok, text, len, flags, &ids, &n);
        if (s != CKV_STATUS_OK && strstr(ckv_error_message(), "not valid UTF-8"))
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
    }
    free(owned);
    ckv_tokenizer_free(tok);
    if (fflush(stdout) != 0) ckv_cli_die("cannot write to stdout");
    return 0;
}
