"""test_api_fields.py - every request field docs/openapi.yaml documents takes effect or is refused.

Walks the request schemas of /v1/completions and /v1/chat/completions in docs/openapi.yaml and runs,
for each documented field, a case on the fixture model (tests/fixtures/models/llama_gqa, token-id
prompts, the chatml template) showing that the field changes the answer, the usage or the response
shape where it should (or, for the fields the server cannot honour, that it is refused with a 400
naming it); a documented field without a case fails the test, and so does a case for an undocumented
field. Then: an unknown field is refused naming it; logit_bias, the penalties, min_p and logprobs
against hand computations from the server's own top_logprobs; a list of prompts; max_tokens defaulting
to the rest of the window; "press": "none" on a server with a default press and budget; press errors
naming request fields; GET /v1/models/{id}; a default composed press with a per_layer: member (a list
of another depth refused at start).
usage: test_api_fields.py CKV_BINARY FIXTURES_DIR TMP_DIR"""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import REPO, Checks, Server, ids, preamble  # noqa: E402

ckv, fixtures, tmp, FIXTURE = preamble(openai=False)
import yaml  # noqa: E402  (schemathesis brings PyYAML into the test venv)

EOS = 2
t = Checks()
s = Server(ckv, FIXTURE, tmp, "--model-name", "llama_gqa", "--max-tokens-limit", "256", "--template", "chatml",
           "--press", "snapkv", "--budget", "0.5", name="fields")


def post(path, body):
    st, _, raw = s.request("POST", path, body)
    try:
        return st, json.loads(raw)
    except ValueError:
        return st, raw.decode(errors="replace")


def comp(**kw):
    body = {"prompt": ids(24, 1), "max_tokens": 8, "temperature": 0, "ignore_eos": True, "press": "none"}
    body.update(kw)
    return post("/v1/completions", {k: v for k, v in body.items() if v is not None})


def chat(**kw):
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "press": "none"}
    body.update(kw)
    return post("/v1/chat/completions", {k: v for k, v in body.items() if v is not None})


def text(r):
    c = r[1]["choices"][0]
    return c["text"] if "text" in c else c["message"]["content"]


def decode_usage(**kw):
    u = comp(**kw)[1]["usage"]
    return u["decode_compressions"], u["decode_evicted_entries"]


def refused(r, param):
    return r[0] == 400 and isinstance(r[1], dict) and r[1]["error"]["param"] == param


def sse(path, body):
    st, _, raw = s.request("POST", path, body)
    ev = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    return st, ev


base = comp()
assert base[0] == 200, base
base_ids_text = text(base)
sampled = comp(temperature=1.0, seed=3)
top = comp(max_tokens=1, logprobs=5)[1]["choices"][0]["logprobs"]["top_logprobs"][0]


def greedy_equal(r):
    return r[0] == 200 and text(r) == base_ids_text


# one case per documented field: (endpoint, field) -> (check, what it shows)
C = {}
C["model"] = lambda: (comp(model="llama_gqa")[0] == 200 and comp(model="other")[0] == 404, "the served id 200, another 404")
C["max_tokens"] = lambda: (comp(max_tokens=3)[1]["usage"]["completion_tokens"] == 3, "completion_tokens follows it")
C["temperature"] = lambda: (text(sampled) != base_ids_text, "temperature 1 (seeded) differs from greedy")
C["top_p"] = lambda: (greedy_equal(comp(temperature=1.0, seed=3, top_p=1e-6)), "top_p ~0 samples the greedy answer")
C["top_k"] = lambda: (greedy_equal(comp(temperature=1.0, seed=3, top_k=1)), "top_k 1 samples the greedy answer")
C["min_p"] = lambda: (greedy_equal(comp(temperature=1.0, seed=3, min_p=1.0)), "min_p 1 samples the greedy answer")
C["n"] = lambda: (len(comp(n=3)[1]["choices"]) == 3, "three choices")
C["seed"] = lambda: (text(comp(temperature=1.0, seed=3)) == text(sampled) != text(comp(temperature=1.0, seed=4)),
                     "the same seed repeats, another differs")
C["stop"] = lambda: (text(comp(stop=base_ids_text[2:4])) == base_ids_text[:2] if len(base_ids_text) >= 4 else True,
                     "the answer ends before the stop string")
C["stream"] = lambda: (len(sse("/v1/completions", {"prompt": ids(24, 1), "max_tokens": 4, "temperature": 0,
                                                   "ignore_eos": True, "stream": True})[1]) >= 2, "server-sent events")
C["stream_options"] = lambda: (any(e.get("usage") for e in sse("/v1/completions", {
    "prompt": ids(24, 1), "max_tokens": 2, "ignore_eos": True, "stream": True,
    "stream_options": {"include_usage": True}})[1]), "a usage chunk")
C["ignore_eos"] = lambda: (comp(ignore_eos=False, logit_bias={str(EOS): 100})[1]["choices"][0]["finish_detail"] == "eos" and
                           comp(ignore_eos=True, logit_bias={str(EOS): 100})[1]["usage"]["completion_tokens"] == 8,
                           "eos forced by logit_bias ends the answer unless ignore_eos")
C["logit_bias"] = lambda: (comp(logit_bias={"77": 100})[1]["choices"][0]["logprobs"] is None and
                           all(x == 77 for x in token_ids(comp(logit_bias={"77": 100}, max_tokens=4))), "+100 forces the token")
C["frequency_penalty"] = lambda: (penalty_case("frequency_penalty"), "the greedy answer's first repeated token is replaced")
C["presence_penalty"] = lambda: (penalty_case("presence_penalty"), "the greedy answer's first repeated token is replaced")
C["repetition_penalty"] = lambda: (text(comp(repetition_penalty=50.0, max_tokens=16)) != text(comp(max_tokens=16)),
                                   "a strong penalty changes the greedy answer")
C["user"] = lambda: (greedy_equal(comp(user="someone")), "accepted; the answer is unchanged (an identifier)")
C["press"] = lambda: (comp(press="snapkv", budget=0.3, context=ids(300, 5))[1]["usage"]["kv_entries_kept"] <
                      comp(press="none", context=ids(300, 5))[1]["usage"]["kv_entries_kept"], "fewer kept entries")
C["budget"] = lambda: (comp(press="snapkv", budget=0.3, context=ids(300, 5))[1]["usage"]["kv_entries_kept"] <
                       comp(press="snapkv", budget=0.8, context=ids(300, 5))[1]["usage"]["kv_entries_kept"], "kept entries follow it")
C["compression_ratio"] = lambda: (comp(press="snapkv", compression_ratio=0.7, context=ids(300, 5))[1]["usage"]["kv_entries_kept"] <
                                  comp(press="snapkv", compression_ratio=0.2, context=ids(300, 5))[1]["usage"]["kv_entries_kept"],
                                  "kept entries follow it")
C["query_aware"] = lambda: (comp(context=ids(100, 6), query_aware=True)[1]["usage"]["context_tokens"] == 124, "the question joins the context")
C["decode_press"] = lambda: (decode_usage(decode_press="knorm", decode_interval=2, decode_target=4)[0] > 0 and
                             decode_usage()[0] == 0 and refused(comp(decode_press="snapkv"), "decode_press"),
                             "knorm compresses while decoding (none without it); snapkv 400")
C["decode_interval"] = lambda: (decode_usage(decode_press="knorm", decode_interval=2, decode_target=4)[0] >
                                decode_usage(decode_press="knorm", decode_interval=4, decode_target=4)[0] and
                                refused(comp(decode_interval=2), "decode_interval"), "compressions follow it; alone 400")
C["decode_target"] = lambda: (decode_usage(decode_press="knorm", decode_interval=2, decode_target=4)[1] >
                              decode_usage(decode_press="knorm", decode_interval=2, decode_target=16)[1], "evicted entries follow it")
C["decode_ratio"] = lambda: (decode_usage(decode_press="knorm", decode_interval=2, decode_ratio=0.8)[1] >
                             decode_usage(decode_press="knorm", decode_interval=2, decode_ratio=0.2)[1] and
                             refused(comp(decode_press="knorm", decode_target=4, decode_ratio=0.5), "decode_ratio"),
                             "evicted entries follow it; with decode_target 400")
C["press_options"] = lambda: (
    comp(press="per_layer:snapkv", press_options={"compression_ratios": [0.8, 0.8, 0.8]}, context=ids(300, 5))[1]["usage"]["kv_entries_kept"] <
    comp(press="per_layer:snapkv", press_options={"compression_ratios": [0.2, 0.2, 0.2]}, context=ids(300, 5))[1]["usage"]["kv_entries_kept"] and
    "window=8" in comp(press="snapkv", budget=0.5, press_options={"window": 8}, context=ids(300, 5))[1]["usage"]["press"] and
    refused(comp(press="per_layer:snapkv", press_options={"compression_ratios": [0.5, 0.5]}), "press_options") and
    refused(comp(press="snapkv", budget=0.5, press_options={"n_sink": 2}), "press_options") and
    refused(comp(press="snapkv", budget=0.5, press_options={"bogus": 1}), "press_options") and
    refused(comp(press="headkv:snapkv", budget=0.5, press_options={"profile": "/etc/hosts"}), "press_options") and
    refused(comp(press="snapkv", budget=0.5, press_options=[1]), "press_options") and
    "press_ratios=[0.5,0.5]" in comp(press="composed:snapkv+knorm", press_options={"press_ratios": [0.5, 0.5]},
                                     context=ids(300, 5))[1]["usage"]["press"] and
    refused(comp(press="composed:snapkv+knorm", press_options={"press_ratios": [0.5]}), "press_options") and
    refused(comp(press="composed:snapkv+knorm", context=ids(300, 5)), "press_options") and
    "key_rerotation:critical(alpha=0.25,eps=0.0001):snapkv(window=8," in comp(
        press="key_rerotation:critical:snapkv", budget=0.5, press_options={"alpha": 0.25, "window": 8},
        context=ids(300, 5))[1]["usage"]["press"] and
    "composed(press_ratios=[0.5,0.25]):critical(alpha=0.25,eps=0.0001):snapkv" in comp(
        press="composed:critical:snapkv+knorm", press_options={"press_ratios": [0.5, 0.25], "alpha": 0.25},
        context=ids(300, 5))[1]["usage"]["press"] and
    "composed(press_ratios=[0.5,0.25]):chunkkv(chunk_length=16):snapkv(window=8,kernel=5,pool=avg)+critical(alpha=0.25," in comp(
        press="composed:chunkkv:snapkv+critical:knorm",
        press_options={"press_ratios": [0.5, 0.25], "alpha": 0.25, "chunk_length": 16, "window": 8},
        context=ids(300, 5))[1]["usage"]["press"] and
    refused(comp(press="composed:snapkv+chunkkv:knorm", press_options={"press_ratios": [0.5, 0.25]}), "press") and
    "composed(press_ratios=[0.5]):per_layer(compression_ratios=[0.25,0.5,0.75]):snapkv(window=64," in comp(
        press="composed:per_layer:snapkv+knorm", press_options={"compression_ratios": [0.25, 0.5, 0.75], "press_ratios": [0.5]},
        context=ids(300, 5))[1]["usage"]["press"] and
    comp(press="composed:snapkv+per_layer:knorm", press_options={"compression_ratios": [0.8, 0.8, 0.8], "press_ratios": [0.5]},
         context=ids(300, 5))[1]["usage"]["kv_entries_kept"] <
    comp(press="composed:snapkv+per_layer:knorm", press_options={"compression_ratios": [0.2, 0.2, 0.2], "press_ratios": [0.5]},
         context=ids(300, 5))[1]["usage"]["kv_entries_kept"] and
    refused(comp(press="composed:per_layer:snapkv+knorm",
                 press_options={"compression_ratios": [0.25, 0.5, 0.75], "press_ratios": [0.5, 0.5]}), "press_options") and
    refused(comp(press="composed:per_layer:snapkv+knorm", press_options={"compression_ratios": [0.5, 0.5], "press_ratios": [0.5]}),
            "press_options") and
    refused(comp(press="composed:per_layer:snapkv+knorm", press_options={"press_ratios": [0.5]}), "press_options") and
    refused(comp(press="composed:snapkv+headkv:knorm", press_options={"press_ratios": [0.5, 0.5]}), "press") and
    refused(comp(press="adakv:critical:snapkv", budget=0.5), "press"),
    "per-layer ratios set the kept entries, window reaches the spec; a wrong count, an option not taken, an unknown "
    "one, a file, a non-object: 400; composed's press_ratios, its wrapped members' options and a stacked "
    "key_rerotation:critical: reach the spec (press_ratios missing or short: 400); a per_layer: member's ratios set the "
    "kept entries and reach the spec (a press_ratios entry for it, a wrong layer count or none: 400 naming "
    "press_options); a stack kvpress refuses (a headkv: member) or a member order ckv cannot match: 400 naming press")
C["decode_press_options"] = lambda: (
    "n_sink=2" in comp(decode_press="streaming_llm", decode_interval=2, decode_target=6,
                       decode_press_options={"n_sink": 2})[1]["usage"]["decode_press"] and
    refused(comp(decode_press="knorm", decode_press_options={"n_sink": 2}), "decode_press_options") and
    refused(comp(decode_press_options={"n_sink": 2}), "decode_press_options"),
    "n_sink reaches the decode press; an option knorm does not take, or no decode_press: 400")
C["completions.prompt"] = lambda: (comp(prompt=ids(30, 2))[1]["usage"]["prompt_tokens"] == 30, "prompt_tokens")
C["completions.context"] = lambda: (comp(context=ids(50, 3))[1]["usage"]["context_tokens"] == 50, "context_tokens")
C["completions.logprobs"] = lambda: (len(comp(logprobs=2)[1]["choices"][0]["logprobs"]["token_logprobs"]) == 8, "eight entries")
C["completions.echo"] = lambda: (echo_case(), "the text starts with the prompt; scored prompt tokens")
C["completions.best_of"] = lambda: (comp(best_of=1)[0] == 200 and refused(comp(best_of=2), "best_of"), "= n ok, else 400")
C["completions.suffix"] = lambda: (refused(comp(suffix="x"), "suffix"), "400 naming it")
C["chat.messages"] = lambda: (chat(messages=[{"role": "user", "content": "hi"}])[1]["usage"]["prompt_tokens"] !=
                              chat()[1]["usage"]["prompt_tokens"], "prompt_tokens")
C["chat.max_completion_tokens"] = lambda: (chat(max_tokens=None, max_completion_tokens=3)[1]["usage"]["completion_tokens"] == 3,
                                           "completion_tokens follows it")
C["chat.context"] = lambda: (chat(context="some document text " * 10)[1]["usage"]["context_tokens"] > 20, "context_tokens")
C["chat.logprobs"] = lambda: (len(chat(logprobs=True)[1]["choices"][0]["logprobs"]["content"]) == 8, "eight entries")
C["chat.top_logprobs"] = lambda: (len(chat(logprobs=True, top_logprobs=3)[1]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3
                                  and refused(chat(top_logprobs=3), "top_logprobs"), "three alternatives; needs logprobs")
C["chat.response_format"] = lambda: (chat(response_format={"type": "text"})[0] == 200 and json_case() and schema_case() and
                                     refused(chat(response_format={"type": "json_schema"}), "response_format.json_schema") and
                                     refused(chat(response_format={"type": "bogus"}), "response_format.type"),
                                     "text; json_object answers are JSON objects (or prefixes of one); json_schema answers "
                                     "follow the schema; json_schema without one and bogus 400")
C["chat.grammar"] = lambda: (text(chat(grammar='root ::= "ok" [0-9]', ignore_eos=False, temperature=1.0, seed=2)) in
                             [f"ok{d}" for d in range(10)] and refused(chat(grammar="root ::= ("), "grammar"),
                             "the answer follows it; a grammar that does not parse 400")
C["completions.grammar"] = lambda: (text(comp(grammar='root ::= "no" | "yes"', ignore_eos=False)) in ("no", "yes") and
                                    refused(comp(grammar=7), "grammar"), "the answer follows it; a non-string 400")
# (tools on a template that takes them: test_api_tools.py; this server's chatml takes none)
C["chat.tools"] = lambda: (refused(chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
                           "400 naming it on a template without tools")
C["chat.tool_choice"] = lambda: (chat(tool_choice="none")[0] == 200 and refused(chat(tool_choice="auto"), "tool_choice"),
                                 "none ok; auto needs tools")
C["chat.parallel_tool_calls"] = lambda: (refused(chat(parallel_tool_calls=True), "parallel_tool_calls"), "400 without tools")
C["chat.functions"] = lambda: (refused(chat(functions=[{"name": "f"}]), "functions"), "400 naming it")
C["chat.function_call"] = lambda: (refused(chat(function_call="auto"), "function_call"), "400 naming it")


def token_ids(r):
    _, _, raw = s.request("POST", "/tokenize", {"prompt": text(r), "add_special_tokens": False})
    return json.loads(raw)["tokens"]


def penalty_case(field):
    """The greedy answer repeats a token; with the penalty it is the same up to that repeat and differs there."""
    def toks(**kw):
        return comp(prompt=[5, 6, 7, 8, 9, 10], max_tokens=24, logprobs=0, **kw)[1]["choices"][0]["logprobs"]["tokens"]
    plain, pen = toks(), toks(**{field: 2.0})
    rep = next((i for i in range(len(plain)) if plain[i] in plain[:i]), None)
    return rep is not None and plain[:rep] == pen[:rep] and pen[rep] != plain[rep]


def tok1(text):
    _, _, raw = s.request("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
    return json.loads(raw)["tokens"][0]


def json_case():
    """json_object answers start an object and, when they end, parse as one; driven by logit_bias (+100
    dominates any logit) the answers are exactly {} and {"": ""} whatever the CPU's arithmetic."""
    close, quote = tok1("}"), tok1('"')
    for bias, want in (({str(close): 100}, {}), ({str(quote): 100, str(close): 50}, {"": ""})):
        r = chat(response_format={"type": "json_object"}, max_tokens=60, ignore_eos=False, logit_bias=bias)
        c = r[1]["choices"][0]
        if c["finish_detail"] != "eos" or json.loads(c["message"]["content"]) != want:
            return False
    for seed in range(1, 5):
        r = chat(response_format={"type": "json_object"}, temperature=1.0, seed=seed, max_tokens=40, ignore_eos=False)
        c = r[1]["choices"][0]
        txt = c["message"]["content"]
        if not txt.lstrip().startswith("{") or (c["finish_detail"] == "eos" and not isinstance(json.loads(txt), dict)):
            return False
    return True


def schema_case():
    """json_schema answers (greedy, stopping by themselves) are the schema's: an enum and a bounded integer."""
    sch = {"type": "object", "properties": {"c": {"enum": ["red", "green"]}, "n": {"type": "integer"}},
           "required": ["c", "n"], "additionalProperties": False}
    r = chat(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": sch, "strict": True}},
             max_tokens=60, ignore_eos=False)
    c = r[1]["choices"][0]
    if c["finish_reason"] == "length":
        return c["message"]["content"].startswith('{"c":')
    doc = json.loads(c["message"]["content"])
    return list(doc) == ["c", "n"] and doc["c"] in ("red", "green") and isinstance(doc["n"], int)


def echo_case():
    p = ids(12, 4)
    r = comp(prompt=p, echo=True, logprobs=1, max_tokens=0)
    _, _, raw = s.request("POST", "/detokenize", {"tokens": p})
    ptxt = json.loads(raw)["prompt"]
    lp = r[1]["choices"][0]["logprobs"]
    e = comp(prompt=p, echo=True, max_tokens=2)
    return (r[0] == 200 and text(r) == ptxt and len(lp["token_logprobs"]) == 12 and lp["token_logprobs"][0] is None and
            all(isinstance(x, float) for x in lp["token_logprobs"][1:]) and text(e).startswith(ptxt))


spec = yaml.safe_load(open(os.path.join(REPO, "docs", "openapi.yaml")))
schemas = spec["components"]["schemas"]


def fields(name):
    out = set()
    for part in schemas[name].get("allOf", [schemas[name]]):
        if "$ref" in part:
            out |= set(schemas[part["$ref"].split("/")[-1]]["properties"])
        else:
            out |= set(part.get("properties", {}))
    return out


common = set(schemas["Common"]["properties"])
documented = {f for f in common} | {f"completions.{f}" for f in fields("CompletionRequest") - common} | \
    {f"chat.{f}" for f in fields("ChatRequest") - common}
t.check(documented == set(C), "every documented request field has a case and every case a documented field",
        f"undocumented cases {sorted(set(C) - documented)}, fields without a case {sorted(documented - set(C))}")
for f in sorted(documented & set(C)):
    try:
        ok, what = C[f]()
    except Exception as ex:  # a response without the expected shape
        ok, what = False, f"raised {type(ex).__name__}: {ex}"
    t.check(ok, f"field {f}: {what}")

# an unknown field is refused naming it, on both endpoints
t.check(refused(comp(frobnicate=1), "frobnicate"), "an unknown completions field: 400 naming it")
t.check(refused(chat(echo=True), "echo"), "echo on chat (a completions field): 400 naming it")

# logprobs: the sampled token's value is among its top_logprobs, the greedy token is the top one, and
# the values are a distribution (the top 5 sum to at most 1)
lp = comp(logprobs=5)[1]["choices"][0]["logprobs"]
firsts = [max(d.values()) for d in lp["top_logprobs"]]
t.check(all(abs(a - b) < 1e-6 for a, b in zip(lp["token_logprobs"], firsts)), "greedy tokens are their step's most likely",
        f"{lp['token_logprobs']} vs {firsts}")
t.check(sum(math.exp(v) for v in top.values()) <= 1 + 1e-5, "top_logprobs exponentiate to at most 1 in total")
t.check(lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"]), "text_offset ascending from 0",
        str(lp["text_offset"]))
# logit_bias moves the answer but not the reported logprobs (they are the model's)
biased = comp(max_tokens=1, logprobs=1, logit_bias={"77": 100})[1]["choices"][0]["logprobs"]
t.check(biased["tokens"] == [json.loads(s.request("POST", "/detokenize", {"tokens": [77]})[2])["prompt"]] and
        biased["token_logprobs"][0] < 0, "logit_bias +100 picks token 77; its logprob is the model's", str(biased))
# streamed logprobs equal the whole answer's
ev = sse("/v1/completions", {"prompt": ids(24, 1), "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True,
                             "logprobs": 2, "press": "none"})[1]
streamed = [x for e in ev for c in e["choices"] if c.get("logprobs") for x in c["logprobs"]["token_logprobs"]]
whole = comp(logprobs=2)[1]["choices"][0]["logprobs"]["token_logprobs"]
t.check(len(streamed) == len(whole) and all(abs(a - b) < 1e-6 for a, b in zip(streamed, whole)),
        "streamed logprobs equal the whole answer's", f"{streamed} vs {whole}")
# echo + logprobs: the prompt scored token by token equals the logprobs of the same ids generated
p = ids(10, 8)
sc = comp(prompt=p, echo=True, logprobs=0, max_tokens=0)[1]["choices"][0]["logprobs"]["token_logprobs"]
ok = True
for k in (3, 6, 9):
    nxt = comp(prompt=p[:k], max_tokens=1, logprobs=0, logit_bias={str(p[k]): 100})[1]["choices"][0]["logprobs"]["token_logprobs"][0]
    ok &= abs(nxt - sc[k]) < 1e-4
t.check(ok, "echo's prompt logprobs equal the logprob of generating the same token", str(sc))

# defaults and small gaps
r = post("/v1/completions", {"prompt": ids(1000, 9), "temperature": 0, "ignore_eos": True, "press": "none"})
t.check(r[0] == 200 and r[1]["usage"]["completion_tokens"] == 24, "max_tokens defaults to the rest of the window (1024 - 1000)",
        str(r[1].get("usage") if isinstance(r[1], dict) else r))
r = comp(press=None, budget=None)
t.check(r[0] == 200 and r[1]["usage"]["press"] != "none", "no press field: the server's press")
r = comp(press="none")
t.check(r[0] == 200 and r[1]["usage"]["press"] == "none", "press none on a server with --press snapkv --budget 0.5")
r = comp(press="bogus")
t.check(refused(r, "press") and "--" not in r[1]["error"]["message"], "press errors name request fields, not flags",
        r[1]["error"]["message"] if isinstance(r[1], dict) else str(r))
st, _, raw = s.request("GET", "/v1/models/llama_gqa")
t.check(st == 200 and json.loads(raw)["id"] == "llama_gqa", "GET /v1/models/{id}", f"{st} {raw[:200]}")
st, _, raw = s.request("GET", "/v1/models/other")
t.check(st == 404 and json.loads(raw)["error"]["code"] == "model_not_found", "GET /v1/models/{other}: 404", f"{st}")
r = comp(prompt=[ids(10, 1), ids(12, 2)], n=2)
idx = [c["index"] for c in r[1]["choices"]] if r[0] == 200 else []
t.check(r[0] == 200 and idx == [0, 1, 2, 3] and r[1]["usage"]["prompt_tokens"] == 22,
        "two prompts x n 2: choices 0..3, prompt usage summed", str(r[1])[:300])
same = comp(prompt=ids(12, 2))
t.check(r[0] == 200 and r[1]["choices"][2]["text"] == text(same), "the second prompt's choice equals asking it alone")
t.check(s.stop() == 0, "SIGTERM: exit 0")

# CORS: off by default (OPTIONS is 405, no header); with --cors-origin a preflight needs no key and
# every response names the origin
c = Server(ckv, FIXTURE, tmp, "--model-name", "llama_gqa", "--cors-origin", "https://app.example", name="cors", api_key="k1")
st, h, _ = c.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "https://app.example",
                                                                "Access-Control-Request-Method": "POST"})
t.check(st == 204 and h.get("access-control-allow-origin") == "https://app.example" and "POST" in h.get(
    "access-control-allow-methods", "") and "Authorization" in h.get("access-control-allow-headers", ""),
        "--cors-origin: the preflight is answered (no key needed)", f"{st} {h}")
st, h, _ = c.request("GET", "/v1/models")
t.check(st == 200 and h.get("access-control-allow-origin") == "https://app.example", "--cors-origin: responses carry the header")
t.check(c.stop() == 0, "SIGTERM: exit 0 (CORS server)")
d = Server(ckv, FIXTURE, tmp, "--model-name", "llama_gqa", name="nocors")
st, h, _ = d.request("OPTIONS", "/v1/models")
t.check(st == 405 and "access-control-allow-origin" not in h, "without --cors-origin: no CORS (OPTIONS 405)", f"{st} {h}")
t.check(d.stop() == 0, "SIGTERM: exit 0 (no-CORS server)")

# a composed press with a per_layer: member as the server's default press: applied to a request that
# names no press; a list of another depth than the model's is refused at start in one line
pl = ["--press", "composed:snapkv+per_layer:knorm", "--press-opt", "press_ratios=0.5"]
e = Server(ckv, FIXTURE, tmp, "--model-name", "llama_gqa", *pl, "--press-opt", "compression_ratios=0.25,0.5,0.75",
           name="perlayer")
st, _, raw = e.request("POST", "/v1/completions", {"prompt": ids(300, 5), "max_tokens": 2, "temperature": 0})
got = json.loads(raw)["usage"]["press"] if st == 200 else raw[:300]
t.check(st == 200 and "+per_layer(compression_ratios=[0.25,0.5,0.75]):knorm" in got,
        "a default composed press with a per_layer: member is applied", str(got))
t.check(e.stop() == 0, "SIGTERM: exit 0 (per_layer member server)")
g = subprocess.run([ckv, "serve", "--model", FIXTURE, *pl, "--press-opt", "compression_ratios=0.5,0.5"],
                   capture_output=True, text=True, timeout=60)
t.check(g.returncode != 0 and g.stderr.strip().count("\n") == 0 and "compression_ratios has 2 values, the model has 3"
        in g.stderr, "ckv serve with a per_layer: member's list of another depth: refused in one line", g.stderr[-300:])
t.finish()
