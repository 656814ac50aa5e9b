"""bench_json_mode.py - the cost of constrained decoding (the grammar's vocabulary mask at every step) in
`ckv serve`, as ratios against plain text measured in the same run: the same chat request streamed
with response_format {"type": "text"}, {"type": "json_object"} and {"type": "json_schema"} (a nested
strict schema: objects in objects, an array of bounded strings, a type list), alternating, ROUNDS
times each, ignore_eos so every answer has max_tokens tokens. Prints the inter-token latency of each
run (first to last content chunk over the chunks between) and the ratio of each mode's median to
text's. Needs the openai client (the test venv has it).
usage: python bench_json_mode.py CKV_BINARY MODEL [ROUNDS]"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "server"))
from serve_util import Server  # noqa: E402

ckv, model = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
s = Server(ckv, model, tempfile.mkdtemp(prefix="ckv_bench_json."), "--model-name", "m", name="bench")
c = s.client()
ask = [{"role": "user", "content": "Describe a cat as a JSON object: its name, age, owner (name, address), toys and food."}]
NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "owner": {"type": "object", "properties": {"name": {"type": "string"},
                                                   "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                                 "zip": {"type": ["string", "null"]}},
                                                               "required": ["city", "zip"], "additionalProperties": False}},
                  "required": ["name", "address"], "additionalProperties": False},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 40}},
        "food": {"enum": ["dry", "wet", "raw"]},
    },
    "required": ["name", "age", "owner", "toys", "food"],
    "additionalProperties": False,
}
FORMATS = {"text": {"type": "text"}, "json_object": {"type": "json_object"},
           "json_schema": {"type": "json_schema", "json_schema": {"name": "cat", "schema": NESTED, "strict": True}}}


def itl(fmt):
    ts = []
    for ev in c.chat.completions.create(model="m", messages=ask, max_tokens=48, temperature=0, stream=True,
                                        response_format=FORMATS[fmt], extra_body={"ignore_eos": True}):
        if ev.choices and ev.choices[0].delta.content:
            ts.append(time.time())
    return (ts[-1] - ts[0]) / max(1, len(ts) - 1)


res = {k: [] for k in FORMATS}
for _ in range(rounds):
    for fmt in res:
        res[fmt].append(itl(fmt))
s.stop()
med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
for k, v in res.items():
    print(f"{k:12s} inter-token latency " + ", ".join(f"{x * 1e3:.1f}" for x in v) + " ms")
for k in ("json_object", "json_schema"):
    print(f"median {k} / text = {med[k] / med['text']:.3f} ({med[k] * 1e3:.1f} vs {med['text'] * 1e3:.1f} ms)")
