"""serve_client.py - the client side of tests/cluster/test_serve.sh, run on the cluster's head node:
finds a `ckv serve` job's server from the endpoint file the job writes ("host:port"), refuses any
address outside the cluster's private network, and talks to it with the standard library only.
It does not start or stop servers or jobs.

usage: serve_client.py ENDPOINT_FILE MODEL check PROMPT MAX_TOKENS [ANSWER_FILE]
         GET /health, then one greedy /v1/completions; prints a line per check, exits 1 on a failure;
         writes the completion's text and usage (JSON) to ANSWER_FILE when given
       serve_client.py ENDPOINT_FILE MODEL stream PROMPT MAX_TOKENS N MARK_FILE
         one streaming /v1/completions; creates MARK_FILE once the first event has arrived, reads to
         the end and prints one JSON line: events, finish reasons, [DONE] seen, time of the last event
"""
import http.client
import json
import socket
import sys
import time

CLUSTER_NET = "10.77.0."


def endpoint(path):
    text = open(path).read().strip()
    host, port = text.rsplit(":", 1)
    addr = socket.gethostbyname(host)
    if not addr.startswith(CLUSTER_NET):
        sys.exit(f"FAIL the endpoint {text} resolves to {addr}, outside the cluster ({CLUSTER_NET}0/24): not contacted")
    return text, addr, int(port)


def post(addr, port, body, timeout):
    c = http.client.HTTPConnection(addr, port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def prompt_of(arg):
    return json.loads(arg) if arg.startswith("[") else arg


def check(addr, port, model, prompt, max_tokens, answer_file=None):
    failed = 0

    def say(ok, what):
        nonlocal failed
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        failed += not ok

    c = http.client.HTTPConnection(addr, port, timeout=30)
    c.request("GET", "/health")
    r = c.getresponse()
    body = r.read().decode()
    say(r.status == 200 and json.loads(body).get("status") == "ok", f"GET /health: {r.status} {body}")
    c.close()
    req = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    c, r = post(addr, port, req, 120)
    raw = r.read().decode()
    c.close()
    try:
        out = json.loads(raw)
        ch = out["choices"][0]
        ok = (r.status == 200 and out.get("object") == "text_completion" and out.get("model") == model and
              isinstance(ch.get("text"), str) and ch["text"] != "" and ch.get("finish_reason") == "length" and
              out["usage"]["completion_tokens"] == max_tokens)
        say(ok, f"POST /v1/completions ({max_tokens} tokens): {r.status}, finish {ch.get('finish_reason')}, "
                f"usage {out['usage']['prompt_tokens']}+{out['usage']['completion_tokens']}, text {ch.get('text')!r}")
        if answer_file:
            keep = ("prompt_tokens", "completion_tokens", "kv_entries_kept", "kv_entries_total", "compressed")
            with open(answer_file, "w") as f:
                json.dump({"text": ch["text"], "usage": {k: out["usage"].get(k) for k in keep}}, f)
    except (ValueError, KeyError, IndexError, TypeError):
        say(False, f"POST /v1/completions: {r.status}, not a completion: {raw[:300]}")
    return failed


def stream(addr, port, model, prompt, max_tokens, n, mark):
    req = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "n": n, "temperature": 0, "ignore_eos": True,
           "stream": True}
    got = {"status": None, "events": 0, "finish": [], "done": False, "t_last": None, "error": None}
    try:
        c, r = post(addr, port, req, 120)
        got["status"] = r.status
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            got["t_last"] = time.time()
            if line == "data: [DONE]":
                got["done"] = True
                continue
            ev = json.loads(line[6:])
            got["events"] += 1
            if got["events"] == 1:
                open(mark, "w").close()
            # a stream cut by the drain ends with finish_reason "length" and the extension finish_detail "cancelled"
            got["finish"] += ["cancelled" if ch.get("finish_detail") == "cancelled" else ch["finish_reason"]
                              for ch in ev.get("choices", []) if ch.get("finish_reason")]
        c.close()
    except (OSError, http.client.HTTPException, ValueError) as e:
        got["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(got), flush=True)
    return 0


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    text, addr, port = endpoint(sys.argv[1])
    model, mode, prompt, max_tokens = sys.argv[2], sys.argv[3], prompt_of(sys.argv[4]), int(sys.argv[5])
    if mode == "check":
        print(f"endpoint {text} = {addr}:{port}", flush=True)
        return check(addr, port, model, prompt, max_tokens, sys.argv[6] if len(sys.argv) > 6 else None)
    if mode == "stream" and len(sys.argv) == 8:
        return stream(addr, port, model, prompt, max_tokens, int(sys.argv[6]), sys.argv[7])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
