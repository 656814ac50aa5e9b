/* haystack.h - the filler text of the RULER-style tasks: RULER's repeated noise sentence, a real-prose
 * "essay" haystack (built in: Ambrose Bierce's "The Devil's Dictionary", public domain, from the Debian
 * package dict-devil; or any UTF-8 text file the user names), its split into words and sentences, and
 * the word lists the generators draw keys and words from. It does not build tasks (ruler.c) nor
 * tokenise. */
#ifndef CKV_EVAL_HAYSTACK_H
#define CKV_EVAL_HAYSTACK_H

#include <stddef.h>

#include "core/status.h"

/* The built-in data: the text files of data/haystack, turned into these arrays at build time
 * (cmake/embed_haystack.cmake). */
extern const char ckv_haystack_essay_text[];
extern const unsigned long ckv_haystack_essay_len;
extern const char *const ckv_haystack_nouns[];
extern const int ckv_haystack_nouns_count;
extern const char *const ckv_haystack_adjectives[];
extern const int ckv_haystack_adjectives_count;
extern const char *const ckv_haystack_verbs[];
extern const int ckv_haystack_verbs_count;
extern const char *const ckv_haystack_vocabulary[];
extern const int ckv_haystack_vocabulary_count;

/* RULER's noise haystack: this sentence, repeated. */
#define CKV_HAYSTACK_NOISE "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

/* An essay haystack: its text with whitespace runs collapsed to single spaces, cut into words. */
typedef struct {
    char *text;      /* words separated by single spaces (owned) */
    size_t len;
    size_t *word;    /* [n_words] byte offset of each word in text */
    size_t n_words;
    char source[256]; /* "builtin:devils-dictionary" or the file path */
} ckv_haystack;

/* The built-in public-domain prose. */
ckv_status ckv_haystack_open_builtin(ckv_haystack *h);
/* A user-supplied text file (UTF-8; errors name the file; fewer than 100 words is an error). */
ckv_status ckv_haystack_open_file(ckv_haystack *h, const char *path);
void ckv_haystack_free(ckv_haystack *h); /* accepts zeroed objects */

/* The first n words of the haystack (repeated from the start when n > n_words), joined by single
 * spaces, into *out (malloc'd, NUL-terminated). */
ckv_status ckv_haystack_take_words(const ckv_haystack *h, size_t n, char **out);

/* Sentence boundaries of text (single-spaced prose): a sentence ends after '.', '!' or '?' (and any
 * closing quotes or brackets) followed by a space, unless the word before the mark is a short
 * lowercase abbreviation ("n.", "adj.", "v.t.") or a title ("Mr.", "St."). *starts (malloc'd) gets
 * the byte offset of each sentence; *n its count (>= 1 for non-empty text). The sentences are
 * text[starts[i] .. starts[i+1] - 1) without the separating space. */
ckv_status ckv_haystack_sentences(const char *text, size_t len, size_t **starts, size_t *n);

#endif
