"""Shared definitions of the ckv test oracle: model specs, weight init, prompts, reference runs.

Everything here is deterministic: weights come from torch generators seeded per model, prompts from
numpy generators seeded per model family, and the reference forward runs on one CPU thread so that
regenerating on the same kind of machine reproduces the fixtures bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_MODELS = REPO_ROOT / "tests" / "fixtures" / "models"

PROMPT_LEN = 240  # prompt tokens fed in one prefill forward
N_DECODE = 8  # decode steps fed one token at a time through the KV cache
FIRST_PROMPT_ID = 4  # prompt ids are drawn from [4, vocab): 0..3 stay free for special tokens

# acceptance checks applied to every candidate seed (see make_models.py)
LOGITS_STD_RANGE = (1.0, 5.0)  # std of the logits across the vocabulary, averaged over rows
MIN_MARGIN_F32 = 5e-2  # top-1 minus top-2 logit at every greedy step of the fp32 run
MIN_MARGIN_BF16 = 0.125  # same for the bf16 run (bf16 logits are coarse: 1/32 apart in [4, 8))
MIN_DISTINCT_GREEDY = 5  # the 9 greedy ids must not collapse into a repeated token
# also required: the bf16 run picks the same greedy ids as the fp32 run
MAX_SEED_TRIES = 64


@dataclass
class ModelSpec:
    name: str  # fixture directory name of the fp32 model; the bf16 copy is name + "_bf16"
    arch: str  # "llama" | "mistral" | "qwen2"
    config: dict  # kwargs of the transformers config class
    base_seed: int  # first weight seed tried; later tries use base_seed + k
    gen_eos: int | list  # eos_token_id written to generation_config.json
    bias_std: dict = field(default_factory=dict)  # std of the q/k/v biases, e.g. {"q": 0.5, ...}
    shard: bool = False  # force model.safetensors.index.json + 2 or more shard files
    # tied embeddings double as the LM head: their std sets the logits scale (std ~ emb_std*sqrt(D))
    emb_std: float = 1.0
    lm_head_gain: float = 3.0  # untied LM head std = gain / sqrt(hidden)
    final_norm_mean: float = 1.0  # mean of the final RMSNorm weight (other norms: 1)
    extra: dict = field(default_factory=dict)


SPECS = [
    ModelSpec(
        name="llama_gqa",
        arch="llama",
        config=dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,  # G = 2
            head_dim=16,
            max_position_embeddings=1024,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            # wavelengths of head_dim 16 / theta 1e4: 6.3, 20, 63, 199, ... -> one frequency kept,
            # two in the smoothed band (16 < wavelen < 64), five divided by the factor
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        base_seed=1000,
        gen_eos=2,
    ),
    ModelSpec(
        name="mistral_gqa",
        arch="mistral",
        config=dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,  # G = 4
            head_dim=32,  # explicit, != hidden / heads (16): q_proj is 64 -> 128, o_proj 128 -> 64
            max_position_embeddings=1024,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        base_seed=2000,
        gen_eos=2,
    ),
    ModelSpec(
        name="qwen2_bias",
        arch="qwen2",
        config=dict(
            vocab_size=512,
            hidden_size=96,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,  # G = 3, head_dim = 96 / 6 = 16
            # = factor * original (no YaRN mismatch warning); 1024 covers the eviction fixtures
            # (300 context + 8 question tokens, expected_attention's 512 future positions)
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=256),
            use_sliding_window=False,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
        ),
        base_seed=3000,
        gen_eos=[2, 3],
        # the k bias never changes the attention weights (q.b_k is the same for every key) but it is
        # stored in the cache and seen by key-norm scorers; the v bias adds the same vector to every
        # head output, so a large one drowns the token signal and greedy decoding repeats a token.
        bias_std={"q": 0.5, "k": 0.5, "v": 0.2},
        shard=True,
        # tied: logits std ~ emb_std * sqrt(96) * final_norm_mean ~ 3. A small embedding keeps the
        # token's own embedding (still in the residual stream) from dominating its own logit,
        # which would otherwise make greedy decoding repeat the last token.
        emb_std=0.03,
        final_norm_mean=3.0 / (0.03 * 96**0.5),
    ),
]


def spec_by_name(name: str) -> ModelSpec:
    for s in SPECS:
        if s.name == name:
            return s
    raise KeyError(f"unknown oracle model '{name}' (known: {', '.join(s.name for s in SPECS)})")


def all_fixture_names() -> list[str]:
    """Every fixture directory: each fp32 model followed by its bf16 copy."""
    out = []
    for s in SPECS:
        out += [s.name, s.name + "_bf16"]
    return out


def base_name(fixture_name: str) -> str:
    return fixture_name[: -len("_bf16")] if fixture_name.endswith("_bf16") else fixture_name


def is_bf16(fixture_name: str) -> bool:
    return fixture_name.endswith("_bf16")


def stable_seed(text: str) -> int:
    return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


def setup_torch() -> None:
    """One thread: reproducible reductions, and tiny models gain nothing from more."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def model_classes(arch: str):
    import transformers as tf

    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
    }[arch]


def prompt_ids(spec: ModelSpec) -> list[int]:
    """The fixed prompt of a model family (the fp32 model and its bf16 copy share it)."""
    rng = np.random.Generator(np.random.PCG64(stable_seed("prompt:" + spec.name)))
    vocab = spec.config["vocab_size"]
    return [int(x) for x in rng.integers(FIRST_PROMPT_ID, vocab, size=PROMPT_LEN)]


def build_model(spec: ModelSpec, seed: int):
    """A freshly initialised fp32 model whose activations stay O(1) and logits spread over units.

    HF's own init (normal std 0.02, zero biases) gives near-zero logits where every comparison is
    trivially within tolerance; here: linear weights N(0, 1/fan_in), embeddings N(0, emb_std^2),
    norm weights 1 + N(0, 0.1^2) (final norm: scaled by final_norm_mean), q/k/v biases
    N(0, bias_std[q|k|v]^2), untied LM head N(0, gain^2/D).
    """
    cfg_cls, model_cls = model_classes(spec.arch)
    config = cfg_cls(**spec.config)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)  # HF init draws from the global generator; overwritten below anyway
    model = model_cls(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    hidden = config.hidden_size

    def normal_(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32) * std + mean)

    # named_parameters() skips the tied lm_head.weight (same tensor as the embedding)
    for pname, p in model.named_parameters():
        if pname.endswith("embed_tokens.weight"):
            normal_(p, spec.emb_std)
        elif pname == "lm_head.weight":
            normal_(p, spec.lm_head_gain / hidden**0.5)
        elif pname == "model.norm.weight":
            normal_(p, 0.1 * spec.final_norm_mean, mean=spec.final_norm_mean)
        elif "norm" in pname:
            normal_(p, 0.1, mean=1.0)
        elif pname.endswith(".bias"):
            proj = pname.split(".")[-2]  # q_proj / k_proj / v_proj
            std = spec.bias_std.get(proj[0]) if proj in ("q_proj", "k_proj", "v_proj") else None
            if not std:
                raise RuntimeError(f"{spec.name}: no init rule for bias parameter {pname}")
            normal_(p, std)
        elif pname.endswith("proj.weight"):
            normal_(p, 1.0 / p.shape[1] ** 0.5)
        else:
            raise RuntimeError(f"{spec.name}: no init rule for parameter {pname}")
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=spec.config["bos_token_id"], eos_token_id=spec.gen_eos
    )
    model.eval()
    return model


def param_bytes(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def save_model(model, out_dir: Path, shard: bool) -> None:
    """save_pretrained into a clean directory (stale shards of an earlier run would confuse loaders);
    keeps reference.json / reference_logits.f32 out of the way (dump_logits.py rewrites them)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    kwargs = dict(safe_serialization=True)
    if shard:
        # ~40% of the weights per shard -> 3 shards (a tensor bigger than the limit gets its own)
        kwargs["max_shard_size"] = max(int(param_bytes(model) * 0.4), 1)
    model.save_pretrained(out_dir, **kwargs)
    files = sorted(os.listdir(out_dir))
    if shard:
        n_shards = sum(1 for f in files if f.endswith(".safetensors"))
        if n_shards < 2 or "model.safetensors.index.json" not in files:
            raise RuntimeError(f"{out_dir}: expected a sharded checkpoint, got {files}")
    elif "model.safetensors" not in files:
        raise RuntimeError(f"{out_dir}: expected model.safetensors, got {files}")


def load_model(model_dir: Path, bf16: bool):
    """Load as a user would: eager attention, fp32 or bfloat16."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    model.eval()
    return model


@torch.inference_mode()
def reference_run(model, prompt: list[int], n_decode: int = N_DECODE):
    """Prefill the prompt in one forward, then n_decode greedy steps through the KV cache.

    Returns (logits [len(prompt) + n_decode, V] float32 numpy, greedy ids [n_decode + 1]):
    rows 0..P-1 are the prefill logits, g0 = argmax(row P-1); row P + i is the logits after
    feeding g_i at position P + i, and g_{i+1} = argmax(row P + i).
    """
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    rows = [out.logits[0].float()]
    greedy = [int(torch.argmax(rows[0][-1]))]
    for _ in range(n_decode):
        step = torch.tensor([[greedy[-1]]], dtype=torch.long)
        out = model(input_ids=step, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        row = out.logits[0, -1].float()
        rows.append(row[None])
        greedy.append(int(torch.argmax(row)))
    logits = torch.cat(rows, 0).contiguous().numpy().astype(np.float32, copy=False)
    return logits, greedy


@torch.inference_mode()
def full_forward(model, ids: list[int]) -> np.ndarray:
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


def greedy_margins(logits: np.ndarray, n_prompt: int = PROMPT_LEN) -> list[float]:
    """top-1 minus top-2 logit of every row a greedy token was taken from (rows P-1 .. end)."""
    out = []
    for r in range(n_prompt - 1, logits.shape[0]):
        top2 = np.sort(logits[r])[-2:]
        out.append(float(top2[1] - top2[0]))
    return out


def logits_std(logits: np.ndarray) -> float:
    """std across the vocabulary, averaged over rows."""
    return float(np.mean(np.std(logits.astype(np.float64), axis=1)))


def write_json(path: Path, obj) -> None:
    """Indented JSON with every list of plain numbers on one line (readable diffs of fixtures)."""

    def fmt(o, ind):
        pad, pad_in = " " * ind, " " * (ind + 2)
        if isinstance(o, dict):
            if not o:
                return "{}"
            items = [f"{pad_in}{json.dumps(k)}: {fmt(v, ind + 2)}" for k, v in o.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(o, list) and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in o):
            items = [pad_in + fmt(v, ind + 2) for v in o]
            return "[\n" + ",\n".join(items) + "\n" + pad + "]"
        return json.dumps(o)

    path.write_text(fmt(obj, 0) + "\n")
