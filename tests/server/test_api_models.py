"""test_api_models.py - the request fields of issue-level features on the real models, through the
official openai client (label slow; each model skipped when its file is absent).

SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct (GGUF in models/): response_format json_object
answers parse as JSON objects and end by themselves; chat logprobs (with top_logprobs) and streamed
logprobs agree; completions echo + logprobs + max_tokens 0 scores a text, and the score of a
continuation equals the logprob of generating it token by token (logit_bias forcing each token);
logit_bias -100 removes the greedy answer's first token; a list of prompts answers each.
usage: test_api_models.py CKV_BINARY FIXTURES_DIR TMP_DIR"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import QWEN_CODER, SMOLLM2, Checks, Server, skip, preamble  # noqa: E402

ckv, fixtures, tmp, _ = preamble()

models = [(n, p) for n, p in (("smollm2", SMOLLM2), ("qwen-coder", QWEN_CODER)) if os.path.exists(p)]
if not models:
    skip("neither models/smollm2-135m-instruct-q4_1.gguf nor the Qwen2.5-Coder GGUF is present (tools/models/)")
t = Checks()

for name, path in models:
    s = Server(ckv, path, tmp, "--model-name", name, name=name)
    c = s.client()
    ask = [{"role": "user", "content": "Give the name and the country of the city Paris as a JSON object."}]
    r = c.chat.completions.create(model=name, messages=ask, max_tokens=96, temperature=0,
                                  response_format={"type": "json_object"})
    txt, fin = r.choices[0].message.content, r.choices[0].finish_reason
    try:
        obj = json.loads(txt)
    except ValueError:
        obj = None
    t.check(isinstance(obj, dict) and fin == "stop", f"{name}: json_object answers a JSON object and stops", f"{fin}: {txt!r}")

    r = c.chat.completions.create(model=name, messages=ask, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    t.check(len(lp) >= 1 and all(len(e.top_logprobs) == 3 and abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5 for e in lp),
            f"{name}: greedy chat tokens are their step's most likely (3 alternatives each)")
    streamed = []
    for ev in c.chat.completions.create(model=name, messages=ask, max_tokens=12, temperature=0, logprobs=True, stream=True):
        for ch in ev.choices:
            if ch.logprobs and ch.logprobs.content:
                streamed += [e.logprob for e in ch.logprobs.content]
    t.check(len(streamed) == len(lp) and all(abs(a - e.logprob) < 1e-5 for a, e in zip(streamed, lp)),
            f"{name}: streamed logprobs equal the whole answer's", f"{len(streamed)} vs {len(lp)}")

    # scoring: echo + logprobs + max_tokens 0, against generating the same tokens one by one
    text = "The capital of France is Paris"
    sc = c.completions.create(model=name, prompt=text, max_tokens=0, echo=True, logprobs=1)
    lps = sc.choices[0].logprobs.token_logprobs
    _, _, raw = s.request("POST", "/tokenize", {"prompt": text})
    ids = json.loads(raw)["tokens"]
    t.check(sc.choices[0].text == text and lps[0] is None and len(lps) == len(ids), f"{name}: echo scores every prompt token",
            f"{len(lps)} logprobs for {len(ids)} tokens")
    worst = 0.0
    for k in range(len(ids) - 2, len(ids)):
        g = c.completions.create(model=name, prompt=ids[:k], max_tokens=1, logprobs=0, temperature=0,
                                 logit_bias={str(ids[k]): 100})
        worst = max(worst, abs(g.choices[0].logprobs.token_logprobs[0] - lps[k]))
    t.check(worst < 0.05, f"{name}: a prompt token's score equals the logprob of generating it (max diff {worst:.2e}; "
            "prefill and decode arithmetic on stored weights)")

    g = c.completions.create(model=name, prompt=text, max_tokens=1, temperature=0, logprobs=0)
    first = g.choices[0].logprobs.tokens[0]
    _, _, raw = s.request("POST", "/tokenize", {"prompt": first, "add_special_tokens": False})
    fid = json.loads(raw)["tokens"]
    b = c.completions.create(model=name, prompt=text, max_tokens=1, temperature=0, logprobs=0,
                             logit_bias={str(fid[0]): -100} if len(fid) == 1 else None)
    t.check(len(fid) != 1 or b.choices[0].logprobs.tokens[0] != first, f"{name}: logit_bias -100 removes the greedy token",
            f"{first!r} -> {b.choices[0].logprobs.tokens[0]!r}")

    r = c.completions.create(model=name, prompt=["Paris is in", "Rome is in"], max_tokens=3, temperature=0)
    alone = c.completions.create(model=name, prompt="Rome is in", max_tokens=3, temperature=0)
    t.check([x.index for x in r.choices] == [0, 1] and r.choices[1].text == alone.choices[0].text,
            f"{name}: a list of prompts answers each (the second as asked alone)")
    t.check(s.stop() == 0, f"{name}: SIGTERM: exit 0")
t.finish()
