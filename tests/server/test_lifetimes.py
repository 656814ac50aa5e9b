"""test_lifetimes.py - requests that end inside their first unit of engine work, on the fixture model
(tests/fixtures/models/llama_gqa): max_tokens 0 and 1 (text and token-id prompts, n 1 and 3,
streamed and whole), a first token that matches a stop string, each several times in a row so the
same slots are taken again, with requests of other lengths running beside them. Each answers 200
with the right finish reason and usage, the server stays up, and /metrics shows nothing running
afterwards.
usage: test_lifetimes.py CKV_BINARY FIXTURES_DIR TMP_DIR"""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Checks, Server, ids, preamble  # noqa: E402

ckv, fixtures, tmp, _ = preamble(openai=False)
t = Checks()
s = Server(ckv, os.path.join(fixtures, "models", "llama_gqa"), tmp, "--max-batch", "2", "--interleave-ms", "0",
           name="lifetimes")


def complete(body):
    st, _, raw = s.request("POST", "/v1/completions", body)
    return st, (json.loads(raw) if st == 200 else raw)


for n in range(3):
    st, r = complete({"prompt": "Hello", "max_tokens": 1})
    t.check(st == 200 and r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 1,
            f"max_tokens 1 on a text prompt answers (round {n})", str(r))
    st, r = complete({"prompt": "Hello", "max_tokens": 0})
    t.check(st == 200 and r["choices"][0]["text"] == "" and r["usage"]["completion_tokens"] == 0,
            f"max_tokens 0 answers with no text (round {n})", str(r))
    st, r = complete({"prompt": ids(12, n), "max_tokens": 1, "n": 3, "ignore_eos": True})
    t.check(st == 200 and len(r["choices"]) == 3 and all(c["finish_reason"] == "length" for c in r["choices"]) and
            r["usage"]["completion_tokens"] == 3, f"max_tokens 1 with n 3 answers every choice (round {n})", str(r))
    st, _, raw = s.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "stream": True})
    t.check(st == 200 and raw.rstrip().endswith(b"data: [DONE]"), f"a streamed max_tokens 1 ends with [DONE] (round {n})",
            raw[-200:])

# a first token whose text is a stop string ends the answer inside its first unit
st, r = complete({"prompt": ids(20, 7), "max_tokens": 1, "ignore_eos": True, "temperature": 0})
first = r["choices"][0]["text"] if st == 200 else ""
if first.strip():
    for n in range(3):
        st, r2 = complete({"prompt": ids(20, 7), "max_tokens": 8, "ignore_eos": True, "temperature": 0, "stop": [first.strip()]})
        t.check(st == 200 and r2["choices"][0]["finish_reason"] == "stop" and first.strip() not in r2["choices"][0]["text"],
                f"a first token that is a stop string ends the answer (round {n})", str(r2))
else:
    print(f"note: the first token's text {first!r} is blank; the stop-string case is not run")

# the same short requests while longer ones run beside them (both slots busy, the queue used)
codes = []


def worker(i):
    body = {"prompt": ids(30 + 10 * i, 100 + i), "max_tokens": [0, 1, 16][i % 3], "ignore_eos": True}
    st, r = complete(body)
    codes.append((st, r["usage"]["completion_tokens"] if st == 200 else None, body["max_tokens"]))


th = [threading.Thread(target=worker, args=(i,)) for i in range(9)]
[x.start() for x in th]
[x.join() for x in th]
t.check(len(codes) == 9 and all(st == 200 and got == want for st, got, want in codes),
        "short and long requests side by side all answer with their token counts", str(codes))
st, _, _ = s.request("GET", "/health")
for _ in range(50):  # the gauges follow the last response within one turn of the engine loop
    m = s.metrics()
    if m.get("ckv_running_requests", 1) == 0:
        break
    time.sleep(0.02)
t.check(st == 200 and m.get("ckv_running_requests", 1) == 0 and m.get("ckv_queue_length", 0) == 0,
        "the server is up and holds nothing afterwards", str({k: v for k, v in m.items() if "running" in k or "queue" in k}))
t.check(s.stop() == 0, "SIGTERM: exit 0")
t.finish()
