"""test_load.py - a bounded load test of `ckv serve` on loopback: 16 concurrent clients send 200
completion requests with tiny max_tokens (10 distinct prompts, so most contexts come from the
compressed-context store). Every request must succeed; the server's RSS after the run must stay
within 48 MiB of its RSS after the warm-up (the first 100 requests); p50/p99 latency and throughput
are printed. SmolLM2 when its file is present, else the fixture model with token-id prompts.
usage: test_load.py CKV_BINARY FIXTURES_DIR TMP_DIR"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import SANITIZED, SMOLLM2, Checks, Server, preamble  # noqa: E402

ckv, fixtures, tmp, _ = preamble()

CLIENTS, REQUESTS, WARMUP = 16, 200, 100
text = os.path.exists(SMOLLM2) and not SANITIZED  # the sanitizer build is too slow for SmolLM2 here
model = SMOLLM2 if text else os.path.join(fixtures, "models", "llama_gqa")
s = Server(ckv, model, tmp, "--model-name", "m", "--max-batch", "16", "--max-queue", "64", name="load")
t = Checks()


def prompt(i):
    k = i % 10
    return f"Note {k}: the meeting about topic {k} is scheduled for" if text else [(k * 31 + j * 17) % 500 + 3 for j in range(24)]


lat, errors, lock = [], [], threading.Lock()
next_i = [0]
rss_warm = [0]


def worker():
    c = s.client()
    while True:
        with lock:
            i = next_i[0]
            if i >= REQUESTS:
                return
            next_i[0] += 1
            if i == WARMUP:
                rss_warm[0] = s.rss()
        t0 = time.time()
        try:
            r = c.completions.create(model="m", prompt=prompt(i), max_tokens=4, temperature=0)
            ok = r.usage.completion_tokens >= 1
        except Exception as e:  # any failure counts
            ok = False
            with lock:
                errors.append(repr(e))
        with lock:
            if ok:
                lat.append(time.time() - t0)


t0 = time.time()
th = [threading.Thread(target=worker) for _ in range(CLIENTS)]
[x.start() for x in th]
[x.join() for x in th]
wall = time.time() - t0
rss_end = s.rss()
lat.sort()
p50 = lat[len(lat) // 2] if lat else 0
p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0
m = s.metrics()
print(f"{len(lat)}/{REQUESTS} requests ok in {wall:.1f} s ({len(lat) / wall:.1f} req/s), {CLIENTS} clients; latency p50 {p50 * 1000:.0f} ms, "
      f"p99 {p99 * 1000:.0f} ms; RSS after warm-up {rss_warm[0] / 2**20:.1f} MiB, at the end {rss_end / 2**20:.1f} MiB; "
      f"cache hits {m.get('ckv_cache_hits_total', 0):.0f}, misses {m.get('ckv_cache_misses_total', 0):.0f}")
t.check(not errors and len(lat) == REQUESTS, f"all {REQUESTS} requests of {CLIENTS} concurrent clients succeed", str(errors[:3]))
slack = 48 + (256 if SANITIZED else 0)  # ASan keeps up to 256 MiB of freed memory in quarantine
t.check(rss_end - rss_warm[0] < slack * 2**20, f"RSS stays flat after the warm-up (< {slack} MiB growth)",
        f"{rss_warm[0] / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB")
for _ in range(100):  # the engine thread updates its gauges when it goes idle
    m = s.metrics()
    if m.get("ckv_running_requests", 1) == 0 and m.get("ckv_queue_length", 1) == 0:
        break
    time.sleep(0.05)
t.check(m.get("ckv_running_requests", 1) == 0 and m.get("ckv_queue_length", 1) == 0, "nothing left running or queued")
t.check(s.stop() == 0, "SIGTERM after the load: exit 0")
t.finish()
