"""lm_eval_check.py - lm-evaluation-harness against `ckv serve`, checked sample by sample.

Starts `ckv serve` on MODEL, runs lm-evaluation-harness (its local-completions model, token ids sent
as prompts) on the two local tasks beside this file (ckv_capitals: loglikelihood over four choices;
ckv_arithmetic: generate_until), then re-scores every loglikelihood request of the log with ckv's own
engine path, `ckv generate --dump-logits` (the context prepared, then each prefix of the continuation
asked as a question: the rows that predict each continuation token), and compares the per-sample
log-likelihoods. With --transformers it also scores them with transformers loading the same GGUF
(start the server with --weights-dtype f32 then: the GGUF dequantised at load, as transformers does).
Prints one line per request and the max differences; exits 1 past the tolerances.

usage: python lm_eval_check.py --ckv build/ckv --model models/smollm2-135m-instruct-q4_1.gguf
       --tokenizer DIR_WITH_tokenizer.json [--limit 8] [--serve-args "--weights-dtype f32"] [--transformers]
(run it with the Python of a venv holding lm_eval: python -m venv .venv-lmeval; .venv-lmeval/bin/pip install lm_eval)"""
import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def start_server(ckv, model, tmp, extra):
    port_file = os.path.join(tmp, "port")
    log = open(os.path.join(tmp, "serve.log"), "w")
    cmd = [ckv, "serve", "-m", model, "--model-name", "ckv-model", "--port", "0", "--port-file", port_file, *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    t_end = time.time() + 120
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.time() > t_end:
            sys.exit(f"ckv serve did not start: {open(log.name).read()[-2000:]}")
        time.sleep(0.1)
    return proc, open(port_file).read().strip()


def encode_pair(tok, context, continuation):
    """lm-evaluation-harness's split of a request into context and continuation ids."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation, add_special_tokens=False)
    ctx = tok.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def log_softmax(row):
    m = row.max()
    return row - (m + np.log(np.exp(row.astype(np.float64) - m).sum()))


def ckv_score(ckv, model, ctx, cont, tmp, extra):
    """Sum of log p(cont[k] | ctx + cont[:k]) by `ckv generate`: the context without its last id is the
    prompt; question k is that id followed by cont[:k]; each answer's first row predicts cont[k]."""
    dump = os.path.join(tmp, "rows.f32")
    qs = []
    for k in range(len(cont)):
        qs += ["--question-ids", ",".join(map(str, [ctx[-1], *cont[:k]]))]
    cmd = [ckv, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ctx[:-1])), *qs, "--max-new-tokens", "1",
           "--temperature", "0", "--ignore-eos", "--dump-logits", dump, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ckv generate failed: {r.stderr[-2000:]}")
    rows = np.fromfile(dump, dtype=np.float32).reshape(len(cont), -1)
    return float(sum(log_softmax(rows[k])[cont[k]] for k in range(len(cont))))


def hf_scorer(model_path):
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(model_path), gguf_file=os.path.basename(model_path),
                                             torch_dtype=torch.float32)
    m.eval()

    def score(ctx, cont):
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            lg = m(ids).logits[0].double().log_softmax(-1)
        return float(sum(lg[len(ctx) - 1 + k, cont[k]] for k in range(len(cont))))
    return score


def requests_of(sample):
    """(context, continuation, loglikelihood) of every loglikelihood request of one logged sample."""
    args = sample["arguments"]
    pairs = [(a["arg_0"], a["arg_1"]) for a in args.values()] if isinstance(args, dict) else [tuple(a) for a in args]
    out = []
    for (c, x), resp in zip(pairs, sample["resps"]):
        v = resp[0]
        ll = float(v[0] if isinstance(v, (list, tuple)) else json.loads(str(v).replace("(", "[").replace(")", "]").replace(
            "True", "true").replace("False", "false"))[0])
        out.append((c, x, ll))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckv", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True, help="a directory with the model's tokenizer.json (Hugging Face)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--serve-args", default="", help="extra `ckv serve` flags (also given to `ckv generate` where they apply)")
    ap.add_argument("--transformers", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4, help="lm_eval vs ckv generate")
    ap.add_argument("--tol-hf", type=float, default=1e-3, help="lm_eval vs transformers")
    a = ap.parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    tmp = tempfile.mkdtemp(prefix="ckv_lm_eval.")
    extra = shlex.split(a.serve_args)
    proc, endpoint = start_server(os.path.abspath(a.ckv), os.path.abspath(a.model), tmp, [*extra, "-t", "2"])
    out = os.path.join(tmp, "out")
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
           f"model=ckv-model,base_url=http://{endpoint}/v1/completions,tokenizer_backend=huggingface,"
           f"tokenizer={os.path.abspath(a.tokenizer)},tokenized_requests=True,num_concurrent=1,max_retries=1",
           "--tasks", "ckv_capitals,ckv_arithmetic", "--include_path", HERE, "--limit", str(a.limit), "--log_samples",
           "--output_path", out, "--seed", "1"]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True)
    print(r.stdout[-3000:])
    proc.terminate()
    proc.wait(60)
    if r.returncode != 0:
        sys.exit(f"lm_eval failed ({time.time() - t0:.0f} s): {r.stderr[-4000:]}")
    print(f"lm_eval: {time.time() - t0:.1f} s")
    logs = glob.glob(os.path.join(out, "**", "samples_ckv_capitals_*.jsonl"), recursive=True)
    gen = glob.glob(os.path.join(out, "**", "samples_ckv_arithmetic_*.jsonl"), recursive=True)
    if not logs or not gen:
        sys.exit(f"no sample logs under {out}")
    reqs = [q for line in open(logs[0]) for q in requests_of(json.loads(line))]
    n_gen = sum(1 for _ in open(gen[0]))
    hf = hf_scorer(a.model) if a.transformers else None
    gen_extra = [x for x in extra if x.startswith("--weights-dtype") or x in ("f32", "auto")]
    worst, worst_hf = 0.0, 0.0
    for c, x, ll in reqs:
        ctx, cont = encode_pair(tok, c, x)
        own = ckv_score(a.ckv, a.model, ctx, cont, tmp, gen_extra)
        line = f"{x!r:>14}: lm_eval {ll:.6f}  ckv generate {own:.6f}  diff {abs(ll - own):.2e}"
        worst = max(worst, abs(ll - own))
        if hf:
            ref = hf(ctx, cont)
            worst_hf = max(worst_hf, abs(ll - ref))
            line += f"  transformers {ref:.6f}  diff {abs(ll - ref):.2e}"
        print(line)
    print(f"{len(reqs)} loglikelihood requests, {n_gen} generate_until samples; max |lm_eval - ckv generate| = {worst:.2e}" +
          (f", max |lm_eval - transformers| = {worst_hf:.2e}" if hf else ""))
    ok = worst <= a.tol and (not hf or worst_hf <= a.tol_hf) and len(reqs) > 0 and n_gen > 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
