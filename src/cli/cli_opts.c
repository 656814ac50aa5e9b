/* cli_opts.c - the flag table, its parser and the generated --help (see cli_opts.h). */
#include "cli/cli_opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/threadpool.h"

#define G (CKV_CMD_GENERATE)
#define I (CKV_CMD_INSPECT)
#define T (CKV_CMD_TOKENIZE)
#define A (CKV_CMD_ANALYZE)
#define E (CKV_CMD_EVAL)
#define F (CKV_CMD_FIDELITY)
#define S (CKV_CMD_SERVE)
#define P (CKV_CMD_PROFILE_HEADS)
#define ALL (G | I | T | A | E | F | S | P)
#define BIG 1e300
#define I64 9.2233720368547748e18

static const char *const group_order[] = {"input", "model", "runtime", "sampling", "press", "output", "server"};

/* id, name, alias, kind, group, metavar, help, default, commands, min, max, choices, repeat, per_rank */
static const ckv_opt_def table[] = {
    {CKV_OPT_HELP, "help", 'h', CKV_OPT_KIND_FLAG, "output", NULL, "print this help and exit", NULL, ALL, 0, 0, NULL, 0, 1},
    /* input */
    {CKV_OPT_PROMPT, "prompt", 'p', CKV_OPT_KIND_STR, "input", "TEXT", "the prompt (the context when questions follow) as text", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_PROMPT_FILE, "prompt-file", 'f', CKV_OPT_KIND_STR, "input", "F", "the same, read from a file", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_PROMPT_IDS, "prompt-ids", 0, CKV_OPT_KIND_STR, "input", "LIST", "prompt token ids, comma separated (no tokenizer needed)", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_PROMPT_IDS, "prompt-ids", 0, CKV_OPT_KIND_STR, "input", "LIST", "the context token ids, comma separated", NULL, A, 0, 0, NULL, 0, 0},
    {CKV_OPT_PROMPT_IDS_FILE, "prompt-ids-file", 0, CKV_OPT_KIND_STR, "input", "F", "file with the prompt token ids (commas, spaces or newlines)", NULL, G | A, 0, 0, NULL, 0, 0},
    {CKV_OPT_QUESTION, "question", 0, CKV_OPT_KIND_STR, "input", "TEXT", "a question about the prompt (repeatable), answered after it", NULL, G, 0, 0, NULL, 1, 0},
    {CKV_OPT_QUESTION_IDS, "question-ids", 0, CKV_OPT_KIND_STR, "input", "LIST", "a question fed after the compressed context (repeatable; each is\nanswered from the same compressed context)", NULL, G, 0, 0, NULL, 1, 0},
    {CKV_OPT_QUESTION_IDS, "question-ids", 0, CKV_OPT_KIND_STR, "input", "LIST", "tokens fed after the context (never evicted); the query analysed is the\nlast one's", "the last context token, fed again", A, 0, 0, NULL, 0, 0},
    {CKV_OPT_CHAT, "chat", 0, CKV_OPT_KIND_FLAG, "input", NULL, "render prompt + question as a user turn in the model's chat template", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_CHAT, "chat", 0, CKV_OPT_KIND_FLAG, "input", NULL, "wrap the text as one user turn with the model's chat template", NULL, T, 0, 0, NULL, 0, 0},
    {CKV_OPT_TEMPLATE, "template", 0, CKV_OPT_KIND_STR, "input", "NAME", "chat template instead of the model's own (llama3, llama3.1, llama3.2, chatml,\nqwen2.5, smollm2, mistral, mistral-v0.1); implies --chat", NULL, G | T, 0, 0, NULL, 0, 0},
    {CKV_OPT_SPECIAL_IN_CONTENT, "special-in-content", 0, CKV_OPT_KIND_FLAG, "input", NULL, "with --chat: special-token text in the prompt, question and system text\n(\"<|im_start|>\") becomes special tokens (by default it is plain text)", NULL, G | T, 0, 0, NULL, 0, 0},
    {CKV_OPT_TEMPLATE, "template", 0, CKV_OPT_KIND_STR, "input", "NAME", "chat template (llama3, chatml, smollm2, qwen2.5, mistral, ...) or none for\nplain text", "the tokenizer's own, plain text when it has none", E, 0, 0, NULL, 0, 0},
    {CKV_OPT_SYSTEM, "system", 0, CKV_OPT_KIND_STR, "input", "TEXT", "a system turn (with a chat template)", NULL, G | T | E, 0, 0, NULL, 0, 0},
    {CKV_OPT_LOAD_CACHE, "load-cache", 0, CKV_OPT_KIND_STR, "input", "F", "answer the questions from a saved context instead of a prompt (a query-aware file: its own question)", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_TEXT, "text", 0, CKV_OPT_KIND_STR, "input", "T", "the text", "all of stdin, byte for byte", T, 0, 0, NULL, 0, 0},
    {CKV_OPT_TEXT_FILE, "text-file", 0, CKV_OPT_KIND_STR, "input", "F", "long natural text", NULL, F, 0, 0, NULL, 0, 0},
    {CKV_OPT_DECODE, "decode", 0, CKV_OPT_KIND_FLAG, "input", NULL, "read token ids (spaces/commas) and print the text they decode to", NULL, T, 0, 0, NULL, 0, 0},
    {CKV_OPT_ADD_SPECIAL, "add-special", 0, CKV_OPT_KIND_FLAG, "input", NULL, "add the post-processor's tokens, e.g. a leading bos", "on", T, 0, 0, NULL, 0, 0},
    {CKV_OPT_NO_SPECIAL, "no-special", 0, CKV_OPT_KIND_FLAG, "input", NULL, "do not add them", NULL, T, 0, 0, NULL, 0, 0},
    {CKV_OPT_SPLIT_SPECIAL, "split-special", 0, CKV_OPT_KIND_FLAG, "input", NULL, "treat special-token text such as <|eot_id|> as plain text", NULL, T, 0, 0, NULL, 0, 0},
    {CKV_OPT_SKIP_SPECIAL, "skip-special", 0, CKV_OPT_KIND_FLAG, "input", NULL, "with --decode: leave special tokens out of the text", NULL, T, 0, 0, NULL, 0, 0},
    {CKV_OPT_UTF8_REPLACE, "utf8-replace", 0, CKV_OPT_KIND_FLAG, "input", NULL, "replace invalid UTF-8 in the input with U+FFFD instead of failing", NULL, T, 0, 0, NULL, 0, 0},
    {CKV_OPT_TASK, "task", 0, CKV_OPT_KIND_STR, "input", "LIST", "generated RULER-style tasks: niah_single_1..3, niah_multikey_1..3,\nniah_multivalue, niah_multiquery, vt, cwe, fwe; groups: niah, all", NULL, E, 0, 0, NULL, 0, 0},
    {CKV_OPT_LENGTH, "length", 0, CKV_OPT_KIND_STR, "input", "LIST", "prompt + answer tokens per sample (comma separated for several lengths)", NULL, E, 0, 0, NULL, 0, 0},
    {CKV_OPT_SAMPLES, "samples", 0, CKV_OPT_KIND_INT, "input", "K", "samples per task and length", "10", E, 1, 1 << 24, NULL, 0, 0},
    {CKV_OPT_SEED, "seed", 0, CKV_OPT_KIND_INT, "input", "S", "generator seed of the tasks", "42", E, 0, I64, NULL, 0, 0},
    {CKV_OPT_HAYSTACK, "haystack", 0, CKV_OPT_KIND_STR, "input", "FILE", "prose for the essay haystack", "built in, The Devil's Dictionary (public domain)", E, 0, 0, NULL, 0, 0},
    {CKV_OPT_DATA, "data", 0, CKV_OPT_KIND_STR, "input", "F", "JSONL, one sample per line: context, question(s), answer_prefix, answers,\nmax_new_tokens, task (kvpress / LongBench style)", NULL, E, 0, 0, NULL, 0, 0},
    {CKV_OPT_METRIC, "metric", 0, CKV_OPT_KIND_STR, "input", "NAME", "score every sample with NAME: string_match_all, string_match_part, qa_f1,\nrouge_l, classification, retrieval, count, code_sim", "the task's", E, 0, 0, NULL, 0, 0},
    {CKV_OPT_BAD_INPUT, "bad-input", 0, CKV_OPT_KIND_STR, "input", "skip|stop", "a malformed line, an answer-less sample, a sample longer than the model's\nwindow: skip it with a warning, or stop with an error", "stop", E, 0, 0, "skip|stop", 0, 0},
    {CKV_OPT_CONTEXT, "context", 'c', CKV_OPT_KIND_INT, "input", "L", "context tokens", "max_position_embeddings", I, 1, 1L << 30, NULL, 0, 0},
    {CKV_OPT_CONTEXT, "context", 'c', CKV_OPT_KIND_INT, "input", "L", "context tokens (the compressed part of the text)", "2048", F, 2, 1 << 24, NULL, 0, 0},
    {CKV_OPT_CONTINUATION, "continuation", 0, CKV_OPT_KIND_INT, "input", "T", "continuation tokens fed and compared", "256", F, 2, 1 << 20, NULL, 0, 0},
    {CKV_OPT_NEW_TOKENS, "new-tokens", 0, CKV_OPT_KIND_INT, "input", "N", "question + answer tokens reserved after the context", "256", I, 0, 1L << 30, NULL, 0, 0},
    /* model */
    {CKV_OPT_MODEL, "model", 'm', CKV_OPT_KIND_STR, "model", "PATH", "Hugging Face model directory (config.json + *.safetensors) or GGUF file", NULL, ALL, 0, 0, NULL, 0, 1},
    {CKV_OPT_BACKEND, "backend", 0, CKV_OPT_KIND_STR, "model", "NAME", "compute backend: cpu or cuda (cuda-emu: the CUDA kernels on the CPU\nexecution layer, slow, for tests)", "cpu", G | E | F | A | S, 0, 0, "cpu|cuda|cuda-emu", 0, 0},
    {CKV_OPT_BACKEND, "backend", 0, CKV_OPT_KIND_STR, "model", "NAME", "cuda: also print the GPU memory plan per rank (bf16 weights and KV)", "cpu", I, 0, 0, "cpu|cuda", 0, 0},
    {CKV_OPT_TP, "tp", 0, CKV_OPT_KIND_INT, "model", "N", "tensor-parallel ranks per group; the world is split into groups of N ranks\nthat share the work (data parallelism)", "all ranks", G | E, 1, 1 << 20, NULL, 0, 0},
    {CKV_OPT_TP, "tp", 0, CKV_OPT_KIND_INT, "model", "N", "tensor-parallel ranks to plan for", "1", I, 1, 4096, NULL, 0, 0},
    {CKV_OPT_VERIFY_WEIGHTS, "verify-weights", 0, CKV_OPT_KIND_STR, "model", "HOW", "with several MPI ranks, check at start that every rank reads the same model\nfiles: sample (their headers, tensor tables and blocks of every tensor,\nthe ends of each rank's slice included), full (every byte) or none", "sample", G | E | F | A | S | P, 0, 0, "sample|full|none", 0, 0},
    {CKV_OPT_TP, "tp", 0, CKV_OPT_KIND_INT, "model", "N", "tensor-parallel ranks: a serving job is one group (rank 0 answers HTTP and\nbroadcasts every engine step to the others)", "all ranks", S, 1, 1 << 20, NULL, 0, 0},
    {CKV_OPT_WEIGHTS_DTYPE, "weights-dtype", 0, CKV_OPT_KIND_STR, "model", "T", "weight type on the device: auto (what the backend prefers), f32, bf16, f16", "auto", G | E | A | F | S, 0, 0, "auto|f32|bf16|f16", 0, 0},
    {CKV_OPT_RANDOM_WEIGHTS, "random-weights", 0, CKV_OPT_KIND_INT, "model", "SEED", "weights drawn from SEED instead of read (the model directory needs only\nconfig.json): benchmarks and scale tests; refused where scores would be meaningless", NULL, G | A | E | F, 0, 1e15, NULL, 0, 0},
    /* runtime */
    {CKV_OPT_THREADS, "threads", 't', CKV_OPT_KIND_INT, "runtime", "N", "CPU threads per rank (capped at the cores of the machine)", "the cores, shared among a node's ranks", G | A | E | F | S, 1, 4096, NULL, 0, 1},
    {CKV_OPT_CHUNK, "chunk", 0, CKV_OPT_KIND_INT, "runtime", "N", "prefill chunk length in tokens", "512", G | I | A | E | F | S, 1, 1 << 24, NULL, 0, 0},
    {CKV_OPT_DEVICE, "device", 0, CKV_OPT_KIND_INT, "runtime", "N", "GPU index (--backend cuda)", "the node-local rank", G | E | F | A | S, 0, 4096, NULL, 0, 1},
    {CKV_OPT_KV_DTYPE, "kv-dtype", 0, CKV_OPT_KIND_STR, "runtime", "T", "KV cache element type: f32, f16, bf16", "f32 on cpu, bf16 on cuda", G | E | A | F | S, 0, 0, "f32|f16|bf16", 0, 0},
    {CKV_OPT_COMM_TIMEOUT, "comm-timeout", 0, CKV_OPT_KIND_NUM, "runtime", "SECONDS", "a collective not complete after SECONDS ends the job, naming the rank and\nthe operation (a dead or stalled peer never hangs it)", "300", G | A | E | F | I | T | S, 0.1, 1e7, NULL, 0, 0},
    {CKV_OPT_GPU_MEM_LIMIT, "gpu-mem-limit", 0, CKV_OPT_KIND_NUM, "runtime", "BYTES", "fail unless every rank's GPU memory plan fits in BYTES (--backend cuda)", "the GPU's memory", I, 1, 1e18, NULL, 0, 0},
    /* sampling */
    {CKV_OPT_MAX_NEW_TOKENS, "max-new-tokens", 'n', CKV_OPT_KIND_INT, "sampling", "N", "tokens to generate", "32", G, 0, 1 << 24, NULL, 0, 0},
    {CKV_OPT_MAX_NEW_TOKENS, "max-new-tokens", 'n', CKV_OPT_KIND_INT, "sampling", "N", "generation limit of every question", "the task's", E, 1, 1 << 20, NULL, 0, 0},
    {CKV_OPT_TEMPERATURE, "temperature", 0, CKV_OPT_KIND_NUM, "sampling", "T", "0 = greedy", "0", G, 0, 1e6, NULL, 0, 0},
    {CKV_OPT_TOP_K, "top-k", 0, CKV_OPT_KIND_INT, "sampling", "K", "keep the K most likely tokens (0 = off)", "0", G, 0, 1 << 30, NULL, 0, 0},
    {CKV_OPT_TOP_P, "top-p", 0, CKV_OPT_KIND_NUM, "sampling", "P", "nucleus sampling mass in (0, 1] (1 = off)", "1", G, 1e-9, 1.0, NULL, 0, 0},
    {CKV_OPT_SEED, "seed", 0, CKV_OPT_KIND_INT, "sampling", "S", "sampling seed", "0", G, 0, I64, NULL, 0, 0},
    {CKV_OPT_IGNORE_EOS, "ignore-eos", 0, CKV_OPT_KIND_FLAG, "sampling", NULL, "do not stop at end-of-sequence ids", NULL, G, 0, 0, NULL, 0, 0},
    /* press */
    {CKV_OPT_PRESS, "press", 0, CKV_OPT_KIND_STR, "press", "SPEC", "a press of the registry (docs/presses.md), optionally behind a wrapper,\ne.g. snapkv, keydiff, critical_adakv:snapkv, key_rerotation:critical:snapkv;\nan unknown name lists them all", "none", G | I | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_PRESS, "press", 0, CKV_OPT_KIND_STR, "press", "LIST", "comma-separated presses, e.g. snapkv,adakv:snapkv,critical:snapkv", "none", E, 0, 0, NULL, 0, 0},
    {CKV_OPT_PRESS, "press", 0, CKV_OPT_KIND_STR, "press", "LIST", "comma-separated presses (the full cache is the reference)", NULL, F, 0, 0, NULL, 0, 0},
    {CKV_OPT_PRESS_A, "press-a", 0, CKV_OPT_KIND_STR, "press", "SPEC", "first press", "snapkv", A, 0, 0, NULL, 0, 0},
    {CKV_OPT_PRESS_B, "press-b", 0, CKV_OPT_KIND_STR, "press", "SPEC", "second press", "critical:snapkv", A, 0, 0, NULL, 0, 0},
    {CKV_OPT_BUDGET, "budget", 0, CKV_OPT_KIND_NUM, "press", "B", "kept fraction in (0, 1] (compression ratio 1 - B)", NULL, G | I | S, -BIG, BIG, NULL, 0, 0},
    {CKV_OPT_BUDGET, "budget", 0, CKV_OPT_KIND_STR, "press", "LIST", "comma-separated kept fractions in (0, 1], e.g. 0.1,0.2,0.4", NULL, A | E | F, 0, 0, NULL, 0, 0},
    {CKV_OPT_COMPRESSION_RATIO, "compression-ratio", 0, CKV_OPT_KIND_NUM, "press", "R", "fraction removed in [0, 1) (kvpress's spelling)", NULL, G | I | A | S, -BIG, BIG, NULL, 0, 0},
    {CKV_OPT_BUDGET_TOKENS, "budget-tokens", 0, CKV_OPT_KIND_INT, "press", "N", "keep N tokens per head", NULL, G | I | A | S, -(1L << 30), 1L << 30, NULL, 0, 0},
    {CKV_OPT_WINDOW, "window", 0, CKV_OPT_KIND_STR, "press", "N", "observation window (snapkv, pyramidkv, defensivekv)", "64", G | A | E | F | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_KERNEL, "kernel", 0, CKV_OPT_KIND_STR, "press", "K", "pooling kernel, odd (snapkv, pyramidkv)", "5", G | A | E | F | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_POOL, "pool", 0, CKV_OPT_KIND_STR, "press", "avg|max", "pooling (snapkv, pyramidkv)", "avg", G | A | E | F | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_ALPHA, "alpha", 0, CKV_OPT_KIND_STR, "press", "A", "first-stage ratio of critical:", "0.5", G | A | E | F | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_EPS, "eps", 0, CKV_OPT_KIND_STR, "press", "E", "epsilon of critical:", "1e-4", G | A | E | F | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_SAFEGUARD, "safeguard", 0, CKV_OPT_KIND_STR, "press", "S", "alpha_safeguard of adakv:", "0.2", G | A | E | F | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_PROFILE, "profile", 0, CKV_OPT_KIND_STR, "press", "F", "head-importance profile (JSON) of headkv:", NULL, G | A | E | F | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_PRESS_OPT, "press-opt", 0, CKV_OPT_KIND_STR, "press", "KEY=VALUE", "any press option (repeatable), e.g. n_sink=8, lag_size=64, seed=1, and the\nones above; an unknown key lists them all", NULL, G | A | E | F | S, 0, 0, NULL, 1, 0},
    {CKV_OPT_QUERY_AWARE, "query-aware", 0, CKV_OPT_KIND_FLAG, "press", NULL, "compress context + question together", "the context only: one compressed cache\nanswers every question of a context", G | E | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_DECODE_PRESS, "decode-press", 0, CKV_OPT_KIND_STR, "press", "SPEC", "compress during generation too, with this attention-free press (knorm,\nkeydiff, streaming_llm, random, lagkv, cur, leverage): kvpress's DecodingPress", NULL, G | E | S, 0, 0, NULL, 0, 0},
    {CKV_OPT_DECODE_INTERVAL, "decode-interval", 0, CKV_OPT_KIND_INT, "press", "N", "decode steps between two decode-time compressions", "512", G | E | S, 1, 1 << 24, NULL, 0, 0},
    {CKV_OPT_DECODE_TARGET, "decode-target", 0, CKV_OPT_KIND_INT, "press", "T", "entries per KV head a decode-time compression keeps", "2048", G | E | S, 1, 1 << 24, NULL, 0, 0},
    {CKV_OPT_DECODE_RATIO, "decode-ratio", 0, CKV_OPT_KIND_NUM, "press", "R", "instead of --decode-target: remove the fraction R in [0, 1) of the tokens seen\nso far (kvpress's CompressionRatioDecodingPress)", NULL, G | E | S, 0, 1, NULL, 0, 0},
    {CKV_OPT_NO_BASELINE, "no-baseline", 0, CKV_OPT_KIND_FLAG, "press", NULL, "do not run the full cache", NULL, E, 0, 0, NULL, 0, 0},
    /* profile-heads */
    {CKV_OPT_SAMPLES, "samples", 0, CKV_OPT_KIND_INT, "input", "N", "needle probes", "20", P, 1, 1 << 20, NULL, 0, 0},
    {CKV_OPT_LENGTH, "length", 0, CKV_OPT_KIND_INT, "input", "T", "tokens of each probe", "2048", P, 64, 1 << 24, NULL, 0, 0},
    {CKV_OPT_SEED, "seed", 0, CKV_OPT_KIND_INT, "input", "S", "seed of the probes", "42", P, 0, I64, NULL, 0, 0},
    {CKV_OPT_HAYSTACK, "haystack", 0, CKV_OPT_KIND_STR, "input", "FILE", "prose around the needles", "built in, The Devil's Dictionary (public domain)", P, 0, 0, NULL, 0, 0},
    {CKV_OPT_TOPK, "topk", 0, CKV_OPT_KIND_INT, "input", "K", "rows of each head's attention searched for needle tokens", "the needle sentence's length, as HeadKV", P, 1, 1 << 24, NULL, 0, 0},
    {CKV_OPT_COUNT_PROBES, "count-probes", 0, CKV_OPT_KIND_STR, "input", "answered|all", "probes that count: those the model answers greedily (HeadKV's), or all", "answered", P, 0, 0, "answered|all", 0, 0},
    {CKV_OPT_THREADS, "threads", 't', CKV_OPT_KIND_INT, "runtime", "N", "CPU threads (capped at the cores of the machine)", "the cores", P, 1, 4096, NULL, 0, 1},
    {CKV_OPT_CHUNK, "chunk", 0, CKV_OPT_KIND_INT, "runtime", "N", "prefill chunk length in tokens", "512", P, 1, 1 << 24, NULL, 0, 0},
    {CKV_OPT_OUT, "out", 0, CKV_OPT_KIND_STR, "output", "F", "the head-importance profile (JSON) of the headkv presses", NULL, P, 0, 0, NULL, 0, 0},
    {CKV_OPT_PROBES_OUT, "probes-out", 0, CKV_OPT_KIND_STR, "output", "F", "the probes as JSON lines (token ids, needle span)", NULL, P, 0, 0, NULL, 0, 0},
    {CKV_OPT_SEPARATE_PREFILL, "separate-prefill", 0, CKV_OPT_KIND_FLAG, "press", NULL, "prefill the context again for every press x budget (the same results, slower)", "one prefill per context serves every press x budget", E | F, 0, 0, NULL, 0, 0},
    /* output */
    {CKV_OPT_OUT, "out", 0, CKV_OPT_KIND_STR, "output", "DIR", "results.jsonl, summary.md, summary.json, score_vs_budget.svg; a rerun with the\nsame arguments resumes (what is done is skipped)", NULL, E, 0, 0, NULL, 0, 0},
    {CKV_OPT_OUT, "out", 0, CKV_OPT_KIND_STR, "output", "F", "one JSON line per (layer, query head)", NULL, A, 0, 0, NULL, 0, 0},
    {CKV_OPT_OUT, "out", 0, CKV_OPT_KIND_STR, "output", "F", "JSON lines, one per press x budget", NULL, F, 0, 0, NULL, 0, 0},
    {CKV_OPT_STATS_JSON, "stats-json", 0, CKV_OPT_KIND_STR, "output", "F", "per budget: the share of heads where B perturbs less, mean perturbations and\nbound tightness, as JSON", NULL, A, 0, 0, NULL, 0, 0},
    {CKV_OPT_LAYERWISE, "layerwise", 0, CKV_OPT_KIND_STR, "output", "F", "JSON lines: per press, budget and layer, ||h_c - h_f|| / ||h_f|| of the\nhidden state of the last question token (compressed vs full cache)", NULL, A, 0, 0, NULL, 0, 0},
    {CKV_OPT_STATS_JSON, "stats-json", 0, CKV_OPT_KIND_STR, "output", "F", "write speed and memory figures to F as JSON", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_DUMP_LOGITS, "dump-logits", 0, CKV_OPT_KIND_STR, "output", "F", "write the logits [new tokens, vocab] (float32) that chose each token", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_DUMP_KEPT, "dump-kept", 0, CKV_OPT_KIND_STR, "output", "F", "JSON lines {layer, kv_head, positions} of what each head kept", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_SAVE_CACHE, "save-cache", 0, CKV_OPT_KIND_STR, "output", "F", "save the compressed context to F (with tp > 1: F.rank<r> per rank; --query-aware: one question, kept inside)", NULL, G, 0, 0, NULL, 0, 0},
    {CKV_OPT_PROGRESS, "progress", 0, CKV_OPT_KIND_STR, "output", "MODE", "auto, bar, lines or none (auto: a bar on a terminal, lines otherwise)", "auto", E, 0, 0, "auto|bar|lines|none", 0, 1},
    {CKV_OPT_REPORT_ONLY, "report-only", 0, CKV_OPT_KIND_FLAG, "output", NULL, "rebuild the summary and the plot from DIR's results (no model needed)", NULL, E, 0, 0, NULL, 0, 0},
    {CKV_OPT_COUNT, "count", 0, CKV_OPT_KIND_FLAG, "output", NULL, "print only the number of tokens", NULL, T, 0, 0, NULL, 0, 0},
    /* server (ckv serve) */
    {CKV_OPT_TEMPLATE, "template", 0, CKV_OPT_KIND_STR, "server", "NAME", "chat template instead of the model's own (llama3, chatml, smollm2, qwen2.5,\nmistral, ...)", "the tokenizer's own", S, 0, 0, NULL, 0, 0},
    {CKV_OPT_MODEL_NAME, "model-name", 0, CKV_OPT_KIND_STR, "server", "NAME", "the model id clients send and /v1/models reports", "the model's file name", S, 0, 0, NULL, 0, 0},
    {CKV_OPT_HOST, "host", 0, CKV_OPT_KIND_STR, "server", "ADDR", "address to bind", "127.0.0.1 (this machine only)", S, 0, 0, NULL, 0, 0},
    {CKV_OPT_PORT, "port", 0, CKV_OPT_KIND_INT, "server", "N", "TCP port (0: any free port)", "8080", S, 0, 65535, NULL, 0, 0},
    {CKV_OPT_PORT_FILE, "port-file", 0, CKV_OPT_KIND_STR, "server", "F", "write \"host:port\" to F once listening", NULL, S, 0, 0, NULL, 0, 0},
    {CKV_OPT_API_KEY, "api-key", 0, CKV_OPT_KIND_STR, "server", "KEY", "require \"Authorization: Bearer KEY\" (every endpoint but /health)", "$CKV_API_KEY, else none", S, 0, 0, NULL, 0, 0},
    {CKV_OPT_MAX_BATCH, "max-batch", 0, CKV_OPT_KIND_INT, "server", "N", "sequences decoded together in one forward", "8", S, 1, 32, NULL, 0, 0},
    {CKV_OPT_MAX_QUEUE, "max-queue", 0, CKV_OPT_KIND_INT, "server", "N", "requests waiting for a batch slot before 429", "64", S, 1, 1 << 20, NULL, 0, 0},
    {CKV_OPT_MAX_CONNECTIONS, "max-connections", 0, CKV_OPT_KIND_INT, "server", "N", "concurrent HTTP connections", "256", S, 1, 1 << 16, NULL, 0, 0},
    {CKV_OPT_MAX_BODY_BYTES, "max-body-bytes", 0, CKV_OPT_KIND_STR, "server", "N", "larger request bodies get 413 (K/M/G suffixes)", "8M", S, 0, 0, NULL, 0, 0},
    {CKV_OPT_MAX_PROMPT_TOKENS, "max-prompt-tokens", 0, CKV_OPT_KIND_INT, "server", "N", "longer prompts get 400", "the model's window", S, 1, 1L << 30, NULL, 0, 0},
    {CKV_OPT_MAX_TOKENS_LIMIT, "max-tokens-limit", 0, CKV_OPT_KIND_INT, "server", "N", "larger max_tokens get 400", "4096", S, 1, 1 << 24, NULL, 0, 0},
    {CKV_OPT_DEFAULT_MAX_TOKENS, "default-max-tokens", 0, CKV_OPT_KIND_INT, "server", "N", "cap on max_tokens of requests that name none (0: the rest of the context window, at most --max-tokens-limit)", "0", S, 0, 1 << 24, NULL, 0, 0},
    {CKV_OPT_CACHE_BYTES, "cache-bytes", 0, CKV_OPT_KIND_STR, "server", "N", "memory for compressed contexts reused across requests (K/M/G suffixes;\n0: no reuse)", "256M", S, 0, 0, NULL, 0, 0},
    {CKV_OPT_CACHE_DIR, "cache-dir", 0, CKV_OPT_KIND_STR, "server", "DIR", "also keep compressed contexts as cache files in DIR (they survive restarts)", NULL, S, 0, 0, NULL, 0, 0},
    {CKV_OPT_GRACE_SECONDS, "grace-seconds", 0, CKV_OPT_KIND_NUM, "server", "S", "on SIGTERM, in-flight requests get S seconds before they are cancelled", "30", S, 0, 86400, NULL, 0, 0},
    {CKV_OPT_INTERLEAVE_MS, "interleave-ms", 0, CKV_OPT_KIND_NUM, "server", "MS", "a context's prefill pauses after any layer that ends MS or more after the\nrunning streams' last token, for their next one (0: after every layer)", "50", S, 0, 1e7, NULL, 0, 0},
    {CKV_OPT_MAX_BATCH_TOKENS, "max-batch-tokens", 0, CKV_OPT_KIND_INT, "server", "N", "contexts waiting to be prefilled go through the model together, up to N\ntokens in one forward, each with its own press (0: each alone)", "512", S, 0, 1 << 20, NULL, 0, 0},
    {CKV_OPT_LONG_PROMPT_TOKENS, "long-prompt-tokens", 0, CKV_OPT_KIND_INT, "server", "N", "a context of more than N tokens is prefilled alone, one layer at a time\nbetween the running streams' steps (at most --max-batch-tokens)", "256", S, 1, 1 << 20, NULL, 0, 0},
    {CKV_OPT_CORS_ORIGIN, "cors-origin", 0, CKV_OPT_KIND_STR, "server", "ORIGIN", "answer browsers from ORIGIN (or *): CORS headers and OPTIONS preflights (off by default)", NULL, S, 0, 0, NULL, 0, 0},
    /* server: hostile and slow clients */
    {CKV_OPT_REQUEST_TIMEOUT, "request-timeout", 0, CKV_OPT_KIND_NUM, "server", "S", "a request's headers and body must arrive within S seconds of its start\n(not reset per byte; 0: no deadline)", "30", S, 0, 86400, NULL, 0, 0},
    {CKV_OPT_MAX_CLIENT_CONNECTIONS, "max-client-connections", 0, CKV_OPT_KIND_INT, "server", "N", "concurrent HTTP connections from one client address", "a quarter of --max-connections", S, 1, 1 << 16, NULL, 0, 0},
    {CKV_OPT_SPECIAL_IN_CONTENT, "special-in-content", 0, CKV_OPT_KIND_FLAG, "server", NULL, "let special-token text in chat message content (\"<|im_start|>\") become special\ntokens, as before (by default content is plain text: a user cannot forge turns)", NULL, S, 0, 0, NULL, 0, 0},
};

#define N_TABLE (sizeof table / sizeof table[0])

static const ckv_opt_def *find_long(unsigned cmd, const char *name, size_t len) {
    for (size_t i = 0; i < N_TABLE; i++)
        if ((table[i].cmds & cmd) && strlen(table[i].name) == len && !strncmp(table[i].name, name, len)) return &table[i];
    return NULL;
}

static const ckv_opt_def *find_short(unsigned cmd, char c) {
    for (size_t i = 0; i < N_TABLE; i++)
        if ((table[i].cmds & cmd) && table[i].alias == c) return &table[i];
    return NULL;
}

const char *ckv_opt_flag(ckv_opt_id id) {
    static char buf[CKV_OPT_N_][40];
    for (size_t i = 0; i < N_TABLE; i++)
        if (table[i].id == id) {
            snprintf(buf[id], sizeof buf[id], "--%s", table[i].name);
            return buf[id];
        }
    return "--?";
}

static int in_choices(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, v, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* Validates one value against its table entry (exits 2 naming the flag). */
static void check_value(const char *cmd, const ckv_opt_def *d, const char *v) {
    char flag[48];
    snprintf(flag, sizeof flag, "--%s", d->name);
    if (d->kind == CKV_OPT_KIND_INT) {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end != '\0') ckv_cli_usage_error(cmd, "%s: expected an integer, got '%s'", flag, v);
        if ((double)x < d->min || (double)x > d->max)
            ckv_cli_usage_error(cmd, "%s: %lld is outside [%.0f, %.0f]", flag, x, d->min, d->max);
    } else if (d->kind == CKV_OPT_KIND_NUM) {
        char *end = NULL;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end != '\0' || !isfinite(x)) ckv_cli_usage_error(cmd, "%s: expected a number, got '%s'", flag, v);
        if (x < d->min || x > d->max) ckv_cli_usage_error(cmd, "%s: %g is outside [%g, %g]", flag, x, d->min, d->max);
    } else if (d->kind == CKV_OPT_KIND_STR && d->choices && !in_choices(d->choices, v)) {
        char list[128];
        snprintf(list, sizeof list, "%s", d->choices);
        for (char *p = list; *p; p++)
            if (*p == '|') *p = ',';
        ckv_cli_usage_error(cmd, "%s: expected one of %s, got '%s'", flag, list, v);
    }
}

static void add(ckv_opts *o, const ckv_opt_def *d, const char *v) {
    if (o->n == CKV_OPTS_MAX) ckv_cli_usage_error(o->cmd_name, "more than %d flags", CKV_OPTS_MAX);
    if (!d->repeat)
        for (int i = 0; i < o->n; i++)
            if (o->occ[i].id == d->id) {
                const char *old = o->occ[i].value;
                if (!v || (old && !strcmp(old, v))) return; /* the same again */
                ckv_cli_usage_error(o->cmd_name, "--%s given twice ('%s' and '%s'); give it once", d->name, old, v);
            }
    o->occ[o->n].id = d->id;
    o->occ[o->n].value = v;
    o->occ[o->n].def = d;
    o->n++;
}

void ckv_opts_parse(ckv_opts *o, const ckv_cli_command *cmd, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd->cmd;
    o->cmd_name = cmd->name;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *value = NULL;
        const ckv_opt_def *d = NULL;
        char shown[64];
        if (a[0] == '-' && a[1] == '-' && a[2]) {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            d = find_long(cmd->cmd, a + 2, len);
            if (eq) value = eq + 1;
            snprintf(shown, sizeof shown, "--%.*s", (int)(len < 50 ? len : 50), a + 2);
        } else if (a[0] == '-' && a[1] && a[1] != '-' && !a[2]) {
            d = find_short(cmd->cmd, a[1]);
            snprintf(shown, sizeof shown, "%s", a);
        } else {
            ckv_cli_usage_error(cmd->name, "unexpected argument '%s' (flags start with --)", a);
        }
        if (!d) ckv_cli_usage_error(cmd->name, "unknown flag '%s'", shown);
        if (d->kind == CKV_OPT_KIND_FLAG) {
            if (value) ckv_cli_usage_error(cmd->name, "--%s takes no value (got '%s')", d->name, value);
        } else if (!value) {
            if (i + 1 >= argc) ckv_cli_usage_error(cmd->name, "--%s needs a value", d->name);
            value = argv[++i];
        }
        if (d->id == CKV_OPT_HELP) {
            ckv_opts_help(cmd, stdout);
            exit(0);
        }
        if (value) check_value(cmd->name, d, value);
        add(o, d, value);
    }
}

int ckv_opt_has(const ckv_opts *o, ckv_opt_id id) {
    int n = 0;
    for (int i = 0; i < o->n; i++) n += o->occ[i].id == id;
    return n;
}

const char *ckv_opt_str(const ckv_opts *o, ckv_opt_id id, const char *def) {
    const char *v = def;
    for (int i = 0; i < o->n; i++)
        if (o->occ[i].id == id) v = o->occ[i].value;
    return v;
}

long ckv_opt_long(const ckv_opts *o, ckv_opt_id id, long def) {
    const char *v = ckv_opt_str(o, id, NULL);
    return v ? strtol(v, NULL, 10) : def;
}

double ckv_opt_num(const ckv_opts *o, ckv_opt_id id, double def) {
    const char *v = ckv_opt_str(o, id, NULL);
    return v ? strtod(v, NULL) : def;
}

int ckv_opt_all(const ckv_opts *o, ckv_opt_id id, const char **vals, int cap) {
    int n = 0;
    for (int i = 0; i < o->n; i++)
        if (o->occ[i].id == id) {
            if (n == cap) ckv_cli_usage_error(o->cmd_name, "%s: at most %d values", ckv_opt_flag(id), cap);
            vals[n++] = o->occ[i].value;
        }
    return n;
}

const ckv_opt_def *ckv_opt_def_of(const ckv_opts *o, ckv_opt_id id) {
    for (size_t i = 0; i < N_TABLE; i++)
        if (table[i].id == id && (table[i].cmds & o->cmd)) return &table[i];
    return NULL;
}

void ckv_opts_exclusive(const ckv_opts *o, const ckv_opt_id *ids, int n, const char *why) {
    int first = -1;
    for (int k = 0; k < n; k++) {
        if (!ckv_opt_has(o, ids[k])) continue;
        if (first < 0) {
            first = k;
            continue;
        }
        char a[40];
        snprintf(a, sizeof a, "%s", ckv_opt_flag(ids[first]));
        ckv_cli_usage_error(o->cmd_name, "%s and %s %s: give one", a, ckv_opt_flag(ids[k]), why);
    }
}

int ckv_opts_threads(const ckv_opts *o, int ranks_on_node, int warn) {
    int cores = ckv_cpu_count();
    if (cores < 1) cores = 1;
    if (ckv_opt_has(o, CKV_OPT_THREADS)) {
        int t = (int)ckv_opt_long(o, CKV_OPT_THREADS, 1);
        if (t > cores) {
            if (warn) fprintf(stderr, "ckv: warning: --threads %d is more than the %d cores of this machine; using %d\n", t, cores, cores);
            t = cores;
        }
        return t;
    }
    if (ranks_on_node < 1) ranks_on_node = 1;
    return cores / ranks_on_node > 0 ? cores / ranks_on_node : 1;
}

/* ---- help ------------------------------------------------------------------------------------------ */

static void print_help_text(FILE *f, const char *text, int indent) {
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        int l = e ? (int)(e - p) : (int)strlen(p);
        fprintf(f, "%.*s", l, p);
        if (!e) break;
        fprintf(f, "\n%*s", indent, "");
        p = e + 1;
    }
}

void ckv_opts_help(const ckv_cli_command *cmd, FILE *f) {
    fprintf(f, "usage: ckv %s %s\n", cmd->name, cmd->usage);
    if (cmd->about) fprintf(f, "\n%s\n", cmd->about);
    const int col = 28;
    for (size_t g = 0; g < sizeof group_order / sizeof group_order[0]; g++) {
        int shown = 0;
        for (size_t i = 0; i < N_TABLE; i++) {
            const ckv_opt_def *d = &table[i];
            if (!(d->cmds & cmd->cmd) || strcmp(d->group, group_order[g])) continue;
            if (!shown++) fprintf(f, "\n%s:\n", group_order[g]);
            char head[96];
            int n = snprintf(head, sizeof head, "  %s%c%s--%s%s%s", d->alias ? "-" : "", d->alias ? d->alias : ' ',
                             d->alias ? ", " : "  ", d->name, d->metavar ? " " : "", d->metavar ? d->metavar : "");
            if (!d->alias) n = snprintf(head, sizeof head, "      --%s%s%s", d->name, d->metavar ? " " : "", d->metavar ? d->metavar : "");
            fprintf(f, "%s", head);
            if (n + 2 > col) fprintf(f, "\n%*s", col, "");
            else fprintf(f, "%*s", col - n, "");
            print_help_text(f, d->help, col);
            if (d->def) {
                fprintf(f, " (default: ");
                print_help_text(f, d->def, col);
                fprintf(f, ")");
            }
            fprintf(f, "\n");
        }
    }
}
