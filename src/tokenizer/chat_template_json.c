/* chat_template_json.c - Jinja's `tojson` filter as chat templates see it through transformers
 * (Python's json.dumps with ensure_ascii=False and the default separators ", " and ": ", keys in their
 * given order), so that tool definitions and tool-call arguments render byte for byte as the model saw
 * them in training. It does not parse JSON (the caller hands a cJSON tree) or render messages
 * (chat_template.c). One difference is unavoidable: a parsed number keeps no trace of how it was
 * written, so an integral value is written as an integer (Python writes 2.0 for a float 2.0). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tokenizer/tok_internal.h"

static ckv_status put(ckv_tk_buf *b, const char *s) { return ckv_tk_buf_append(b, s, strlen(s)); }

/* A string as json.dumps(ensure_ascii=False) writes it: quote, backslash and control bytes escaped
 * (\b \f \n \r \t short, the others \u00XX); everything else (non-ASCII included) as is. */
static ckv_status put_string(ckv_tk_buf *b, const char *s) {
    CKV_TRY(put(b, "\""));
    size_t run = 0;
    for (const unsigned char *p = (const unsigned char *)s;; p++) {
        unsigned char c = *p;
        if (c && c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        CKV_TRY(ckv_tk_buf_append(b, p - run, run));
        run = 0;
        if (!c) break;
        char e[8];
        switch (c) {
        case '"': snprintf(e, sizeof e, "\\\""); break;
        case '\\': snprintf(e, sizeof e, "\\\\"); break;
        case '\b': snprintf(e, sizeof e, "\\b"); break;
        case '\f': snprintf(e, sizeof e, "\\f"); break;
        case '\n': snprintf(e, sizeof e, "\\n"); break;
        case '\r': snprintf(e, sizeof e, "\\r"); break;
        case '\t': snprintf(e, sizeof e, "\\t"); break;
        default: snprintf(e, sizeof e, "\\u%04x", c); break;
        }
        CKV_TRY(put(b, e));
    }
    return put(b, "\"");
}

/* A number: an integer's digits, else Python's repr of a float (the shortest digits that read back
 * the same value; plain notation for 1e-4 <= |x| < 1e16 with at least one decimal, else d.ddde+XX). */
static ckv_status put_number(ckv_tk_buf *b, double x) {
    char out[64];
    if (!isfinite(x)) return put(b, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity");
    if (x == floor(x) && fabs(x) < 9007199254740992.0) {
        snprintf(out, sizeof out, "%.0f", x);
        if (!strcmp(out, "-0")) snprintf(out, sizeof out, "0");
        return put(b, out);
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) { /* shortest round trip */
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d[.ddd]e[+-]XX: the digits and the decimal exponent */
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    int neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp10 >= -4 && exp10 < 16) { /* Python's repr: plain notation from 1e-4 up to 1e16 */
        if (exp10 < 0) {
            o += (size_t)snprintf(out + o, sizeof out - o, "0.");
            for (int k = 0; k < -exp10 - 1; k++) out[o++] = '0';
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits);
        } else {
            for (int k = 0; k <= exp10; k++) out[o++] = k < (int)nd ? digits[k] : '0';
            out[o++] = '.';
            if ((int)nd > exp10 + 1) o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits + exp10 + 1);
            else out[o++] = '0';
        }
        out[o] = '\0';
        return put(b, out);
    }
    out[o++] = digits[0];
    if (nd > 1) o += (size_t)snprintf(out + o, sizeof out - o, ".%s", digits + 1);
    snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    return put(b, out);
}

ckv_status ckv_chat_tojson(const cJSON *v, ckv_tk_buf *b) {
    if (!v) return put(b, "null");
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        int obj = cJSON_IsObject(v);
        CKV_TRY(put(b, obj ? "{" : "["));
        int first = 1;
        for (const cJSON *it = v->child; it; it = it->next, first = 0) {
            if (!first) CKV_TRY(put(b, ", "));
            if (obj) {
                CKV_TRY(put_string(b, it->string ? it->string : ""));
                CKV_TRY(put(b, ": "));
            }
            CKV_TRY(ckv_chat_tojson(it, b));
        }
        return put(b, obj ? "}" : "]");
    }
    if (cJSON_IsString(v)) return put_string(b, v->valuestring);
    if (cJSON_IsNumber(v)) return put_number(b, v->valuedouble);
    if (cJSON_IsTrue(v)) return put(b, "true");
    if (cJSON_IsFalse(v)) return put(b, "false");
    return put(b, "null");
}
