"""test_decode_press.py - decode-time compression as a request field of `ckv serve` ("decode_press" with
"decode_interval", "decode_target" or "decode_ratio") on SmolLM2-135M, each greedy answer compared token
for token with `ckv generate` given the same flags on the same ids: knorm with a target and n = 2 (the
second choice starts from the context as prepared, restored after the first answer cut it) and with
logprobs (rows sampled on the host), keydiff
with a ratio streamed, a chat request, two concurrent requests (one with, one without a decode press)
each equal to its own run, a context stored for reuse after a decode-compressed answer reused by
requests with and without a decode press (cache hits equal to fresh runs), the usage's
decode_compressions / decode_evicted_entries and /metrics' counters equal to what `ckv generate`
counts, every bad field or combination a 400 naming it (the CLI's message where it has one), and the
server default (`ckv serve --decode-press ...`) with a request's override and "none".
With CKV_MPIRUN (label mpi: `tp` as the first extra argument), the same answers from a 2-rank group on
the fixture llama_gqa equal a 1-rank server's instead.
usage: test_decode_press.py CKV_BINARY FIXTURES_DIR TMP_DIR [tp]"""
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import SANITIZED, SMOLLM2, Checks, Server, ids, preamble, skip  # noqa: E402

ckv, fixtures, tmp, FIXTURE = preamble(openai=False)
TP = len(sys.argv) > 4 and sys.argv[4] == "tp"
t = Checks()

KNORM = {"decode_press": "knorm", "decode_interval": 8, "decode_target": 24}
KNORM_FLAGS = ["--decode-press", "knorm", "--decode-interval", "8", "--decode-target", "24"]
KEYDIFF = {"decode_press": "keydiff", "decode_interval": 8, "decode_ratio": 0.5}
KEYDIFF_FLAGS = ["--decode-press", "keydiff", "--decode-interval", "8", "--decode-ratio", "0.5"]


def post(s, path, body):
    st, _, b = s.request("POST", path, body)
    return st, json.loads(b) if b else None


def complete(s, prompt, max_tokens, extra=None, **kw):
    st, r = post(s, "/v1/completions", dict(prompt=prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                            **(extra or {}), **kw))
    if st != 200:
        raise RuntimeError(f"completion: {st} {r}")
    return r


def generate(model, prompt, max_tokens, flags, question=None):
    """`ckv generate`'s ids and stats (--stats-json) on the same ids."""
    stats = os.path.join(tmp, "gen_stats.json")
    cmd = [ckv, "generate", "-m", model, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(max_tokens),
           "--ignore-eos", "-t", "2", "--stats-json", stats, *flags]
    if question:
        cmd += ["--question-ids", ",".join(map(str, question))]
    g = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if g.returncode != 0:
        raise RuntimeError(f"ckv generate {flags}: {g.stderr[-600:]}")
    with open(stats) as f:
        st = json.load(f)
    return [int(x) for x in g.stdout.replace(",", " ").split()], st


def text_of(s, gen_ids):
    _, r = post(s, "/detokenize", {"tokens": gen_ids})
    return r["prompt"]


def decode_usage(r):
    u = r["usage"]
    return u["decode_press"], u["decode_compressions"], u["decode_evicted_entries"]


def stats_of(st):
    """decode_compressions and decode_evicted_entries of a --stats-json (the whole object or its stats)."""
    for o in (st, st.get("stats", {}) if isinstance(st, dict) else {}):
        if isinstance(o, dict) and "decode_compressions" in o:
            return o["decode_compressions"], o["decode_evicted_entries"]
    return None


def bad(s, path, body, field, contains=None):
    st, r = post(s, path, body)
    e = (r or {}).get("error", {})
    ok = st == 400 and e.get("param") == field and (contains is None or contains in e.get("message", ""))
    t.check(ok, f"{path} {json.dumps({k: v for k, v in body.items() if k not in ('prompt', 'messages')})}: 400 naming {field}",
            f"{st} {r}")
    return e.get("message", "")


def smollm2_tests():
    if not os.path.exists(SMOLLM2):
        skip(f"{SMOLLM2} is absent (tools/models/fetch_smollm2.sh fetches it)")
    s = Server(ckv, SMOLLM2, tmp, "--max-batch", "4", "--model-name", "smollm2", name="decode")
    p = ids(40, 1)

    # knorm with a target, n = 2: both choices equal the one `ckv generate` answer
    want, gst = generate(SMOLLM2, p, 60, KNORM_FLAGS)
    wt = text_of(s, want)
    r = complete(s, p, 60, KNORM, n=2)
    got = [c["text"] for c in r["choices"]]
    t.check(got == [wt, wt], "knorm target 24 every 8 steps, n=2: both choices equal `ckv generate --decode-press knorm`",
            f"{got} vs {wt!r}")
    gs = stats_of(gst)
    du = decode_usage(r)
    t.check(gs is not None and du == ("knorm interval=8 target=24", 2 * gs[0], 2 * gs[1]) and gs[0] > 0,
            "usage: decode_press, and decode_compressions / decode_evicted_entries of both choices (2x generate's)",
            f"{du} vs generate {gs}")
    r = complete(s, p, 60, KNORM, logprobs=1)  # the step that downloads every row (not sampled on the device)
    t.check(r["choices"][0]["text"] == wt, "knorm with logprobs (host sampling) equals `ckv generate` too",
            f"{r['choices'][0]['text']!r} vs {wt!r}")
    plain, _ = generate(SMOLLM2, p, 60, [])
    t.check(want != plain, "the decode press changed the answer (the comparison means something)")
    m0 = s.metrics()

    # keydiff with a ratio, streamed
    want, gst = generate(SMOLLM2, p, 60, KEYDIFF_FLAGS)
    wt = text_of(s, want)
    st, _, body = s.request("POST", "/v1/completions", dict(prompt=p, max_tokens=60, temperature=0, ignore_eos=True, stream=True,
                                                             stream_options={"include_usage": True}, **KEYDIFF))
    parts, usage = [], None
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            ev = json.loads(line[6:])
            parts += [c["text"] for c in ev.get("choices", [])]
            usage = ev.get("usage") or usage
    t.check(st == 200 and "".join(parts) == wt, "keydiff ratio 0.5 every 8 steps, streamed: equals `ckv generate`",
            f"{''.join(parts)!r} vs {wt!r}")
    gs = stats_of(gst)
    t.check(usage is not None and gs is not None and (usage["decode_compressions"], usage["decode_evicted_entries"]) == gs,
            "the stream's usage counts generate's compressions and evicted entries", f"{usage} vs {gs}")
    m1 = s.metrics()
    t.check(m1.get("ckv_decode_compressions_total", 0) - m0.get("ckv_decode_compressions_total", 0) == gs[0] and
            m1.get("ckv_decode_evicted_entries_total", 0) - m0.get("ckv_decode_evicted_entries_total", 0) == gs[1],
            "/metrics: ckv_decode_compressions_total and ckv_decode_evicted_entries_total count them",
            f"{m0.get('ckv_decode_compressions_total')} -> {m1.get('ckv_decode_compressions_total')}")

    # chat: the same field on /v1/chat/completions
    q = "Write a long story about a dragon who learns to paint."
    g = subprocess.run([ckv, "generate", "-m", SMOLLM2, "--chat", "--prompt", q, "--max-new-tokens", "48", "--ignore-eos", "-t", "2",
                        *KNORM_FLAGS], capture_output=True, text=True, timeout=300)
    st, r = post(s, "/v1/chat/completions", dict(messages=[{"role": "user", "content": q}], max_tokens=48, temperature=0,
                                                 ignore_eos=True, **KNORM))
    got = r["choices"][0]["message"]["content"] if st == 200 else None
    t.check(got == g.stdout.rstrip("\n") and got, "chat with decode_press equals `ckv generate --chat --decode-press`",
            f"{got!r} vs {g.stdout!r}")

    # two concurrent requests, one with a decode press and one without, each equal to its own run
    pa, pb = ids(36, 2), ids(44, 3)
    wa, _ = generate(SMOLLM2, pa, 56, KNORM_FLAGS)
    wb, _ = generate(SMOLLM2, pb, 56, [])
    res = {}
    th = [threading.Thread(target=lambda k, pr, ex: res.__setitem__(k, complete(s, pr, 56, ex)), args=a)
          for a in (("a", pa, KNORM), ("b", pb, None))]
    [x.start() for x in th]
    [x.join() for x in th]
    ga, gb = res["a"]["choices"][0]["text"], res["b"]["choices"][0]["text"]
    t.check(ga == text_of(s, wa) and gb == text_of(s, wb),
            "concurrent: the request with knorm and the one without each equal their own `ckv generate`",
            f"{ga!r} / {gb!r}")
    t.check(decode_usage(res["b"])[1:] == (0, 0), "the request without a decode press compressed nothing", str(decode_usage(res["b"])))

    # a stored context after a decode-compressed answer: reused with and without a decode press
    ctx, q1, q2 = ids(64, 4), ids(6, 5), ids(7, 6)
    press = {"press": "knorm", "compression_ratio": 0.5}
    pflags = ["--press", "knorm", "--compression-ratio", "0.5"]
    r1 = complete(s, q1, 40, dict(press, context=ctx, **KEYDIFF))
    w1, _ = generate(SMOLLM2, ctx, 40, pflags + KEYDIFF_FLAGS, question=q1)
    t.check(r1["choices"][0]["text"] == text_of(s, w1) and decode_usage(r1)[1] > 0,
            "context + question with press knorm and decode keydiff equal `ckv generate --question-ids`", str(decode_usage(r1)))
    for name, extra, flags in (("without", {}, []), ("with", KNORM, KNORM_FLAGS)):
        r2 = complete(s, q2, 40, dict(press, context=ctx, **extra), n=2)
        w2, _ = generate(SMOLLM2, ctx, 40, pflags + flags, question=q2)
        got = [c["text"] for c in r2["choices"]]
        t.check(r2["usage"]["cache_hit"] and got == [text_of(s, w2)] * 2,
                f"the stored context reused {name} a decode press (n=2) equals a fresh run", f"hit {r2['usage']['cache_hit']} {got}")

    # bad fields: 400 naming the field
    for path, base in (("/v1/completions", {"prompt": p}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        bad(s, path, dict(base, decode_press="nosuch"), "decode_press", "nosuch")
        bad(s, path, dict(base, decode_interval=8), "decode_interval", "needs 'decode_press'")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="snapkv"), "decode_press", "attention input")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="adakv:knorm"), "decode_press", "wrappers")
    bad(s, "/v1/completions", dict(prompt=p, decode_target=24), "decode_target", "needs 'decode_press'")
    bad(s, "/v1/completions", dict(prompt=p, decode_ratio=0.5), "decode_ratio", "needs 'decode_press'")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="none", decode_interval=8), "decode_interval")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="knorm", decode_target=24, decode_ratio=0.5), "decode_ratio", "not both")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="knorm", decode_interval=0), "decode_interval")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="knorm", decode_target=0), "decode_target")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="knorm", decode_target="24"), "decode_target")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="knorm", decode_ratio=1.0), "decode_ratio")
    bad(s, "/v1/completions", dict(prompt=p, decode_press="knorm", decode_ratio=0), "decode_ratio")
    bad(s, "/v1/completions", dict(prompt=p, decode_press=3), "decode_press")
    msg = bad(s, "/v1/completions", dict(prompt=p, press="adakv:knorm", budget=0.5, decode_press="knorm"), "decode_press")
    g = subprocess.run([ckv, "generate", "-m", SMOLLM2, "--prompt-ids", "1,2,3", "--press", "adakv:knorm", "--budget", "0.5",
                        "--decode-press", "knorm"], capture_output=True, text=True, timeout=60)
    t.check(g.returncode != 0 and msg and msg in g.stderr, "a press with cross-head allocation before it: the CLI's message",
            f"{msg!r} vs {g.stderr.strip()!r}")
    st, _ = post(s, "/v1/completions", dict(prompt=p[:8], max_tokens=4, temperature=0))
    t.check(st == 200, "the server keeps serving after the refusals")
    t.check(s.stop() == 0, "SIGTERM: exit 0")

    # the server's default, a request's counts over it, and "none"
    d = Server(ckv, SMOLLM2, tmp, "--max-batch", "2", *KNORM_FLAGS, name="decode_default")
    want, _ = generate(SMOLLM2, p, 60, KNORM_FLAGS)
    r = complete(d, p, 60)
    t.check(r["choices"][0]["text"] == text_of(d, want) and decode_usage(r)[0] == "knorm interval=8 target=24",
            "ckv serve --decode-press knorm: a request naming none gets it", str(decode_usage(r)))
    want, _ = generate(SMOLLM2, p, 60, ["--decode-press", "knorm", "--decode-interval", "8", "--decode-target", "30"])
    r = complete(d, p, 60, {"decode_target": 30})
    t.check(r["choices"][0]["text"] == text_of(d, want) and decode_usage(r)[0] == "knorm interval=8 target=30",
            "a request's decode_target over the default's", str(decode_usage(r)))
    r = complete(d, p, 60, {"decode_press": "none"})
    t.check(r["choices"][0]["text"] == text_of(d, plain) and decode_usage(r) == ("none", 0, 0),
            "\"decode_press\": \"none\" turns the default off", str(decode_usage(r)))
    t.check(d.stop() == 0, "SIGTERM: exit 0 (default decode press)")
    g = subprocess.run([ckv, "serve", "-m", SMOLLM2, "--decode-interval", "8"], capture_output=True, text=True, timeout=60)
    t.check(g.returncode != 0 and "--decode-press" in g.stderr, "ckv serve --decode-interval without --decode-press is refused",
            g.stderr.strip())


def tp_tests():
    mpirun = os.environ.get("CKV_MPIRUN")
    if not mpirun:
        skip("no MPI launcher (CKV_MPIRUN is set by CTest when ckv was built with MPI)")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    asan = ["-x", "ASAN_OPTIONS=detect_leaks=0"] if SANITIZED else []
    timeout = "10" if SANITIZED else "5"
    one = Server(ckv, FIXTURE, tmp, "--max-batch", "4", "--comm-timeout", timeout, name="tp1", threads=1)
    two = Server(ckv, FIXTURE, tmp, "--max-batch", "4", "--comm-timeout", timeout, name="tp2", threads=1,
                 launcher=[mpirun, "-np", "2", "--oversubscribe", *asan])
    ctx, q = ids(48, 7), ids(5, 8)
    cases = [("knorm target 24, n=2", dict(prompt=ids(40, 9), n=2), KNORM),
             ("keydiff ratio 0.5", dict(prompt=ids(40, 10)), KEYDIFF),
             ("snapkv context + knorm decode, n=2", dict(prompt=q, context=ctx, press="snapkv", budget=0.5, n=2), KNORM),
             ("the stored context again with keydiff", dict(prompt=q, context=ctx, press="snapkv", budget=0.5), KEYDIFF)]

    def run(s):
        out = {}
        def one_case(name, body, dp):
            r = complete(s, body.pop("prompt"), 48, dict(body, **dp))
            out[name] = ([c["text"] for c in r["choices"]], decode_usage(r), r["usage"]["kv_entries_kept"])
        for name, body, dp in cases[:1]:
            one_case(name, dict(body), dp)
        th = [threading.Thread(target=one_case, args=(n, dict(b), d)) for n, b, d in cases[1:3]]  # batched decode
        [x.start() for x in th]
        [x.join() for x in th]
        one_case(*cases[3][:1], dict(cases[3][1]), cases[3][2])
        return out

    a, b = run(one), run(two)
    for name, _, _ in cases:
        t.check(a[name] == b[name] and a[name][1][1] > 0, f"tp 2 equals 1 rank: {name} (text, decode counts, kept entries)",
                f"tp 2 {b[name]} vs 1 rank {a[name]}")
    t.check(one.stop() == 0 and two.stop() == 0, "SIGTERM: both servers exit 0")


if TP:
    tp_tests()
else:
    smollm2_tests()
t.finish()
