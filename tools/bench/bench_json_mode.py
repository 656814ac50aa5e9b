"""bench_json_mode.py - the cost of response_format json_object (the JSON automaton's vocabulary mask at
every step) in `ckv serve`, as a ratio against plain text measured in the same run: the same chat
request streamed with {"type": "text"} and {"type": "json_object"}, alternating, ROUNDS times each; the
inter-token latency (first to last content chunk over the chunks between) of each, and the ratio of
the medians. Needs the openai client (the test venv has it).
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
ask = [{"role": "user", "content": "Describe a cat as a JSON object with the keys name, age, color, owner, toys and food."}]


def itl(fmt):
    ts = []
    for ev in c.chat.completions.create(model="m", messages=ask, max_tokens=40, temperature=0, stream=True,
                                        response_format={"type": fmt}):
        if ev.choices and ev.choices[0].delta.content:
            ts.append(time.time())
    return (ts[-1] - ts[0]) / max(1, len(ts) - 1)


res = {"text": [], "json_object": []}
for _ in range(rounds):
    for fmt in res:
        res[fmt].append(itl(fmt))
s.stop()
med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
for k, v in res.items():
    print(f"{k:12s} inter-token latency " + ", ".join(f"{x * 1e3:.1f}" for x in v) + " ms")
print(f"median json_object / text = {med['json_object'] / med['text']:.3f} ({med['json_object'] * 1e3:.1f} vs "
      f"{med['text'] * 1e3:.1f} ms)")
