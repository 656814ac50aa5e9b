#!/usr/bin/env python3
"""make_seeds.py - writes the committed seed corpora of the safetensors, config, dataset and cache-file
fuzz targets (corpus/safetensors, corpus/config, corpus/dataset, corpus/kv_file) from the test fixtures
and small synthetic files. Standard library only; rerun after a format change:
    python3 tests/fuzz/make_seeds.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")


def out(corpus, name, data):
    d = os.path.join(HERE, "corpus", corpus)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, pad=0, meta=None):
    """tensors: list of (name, dtype, shape, bytes); the header is padded with spaces to 8 bytes."""
    hdr, off, data = {}, 0, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8 + pad)
    return struct.pack("<Q", len(h)) + h + data


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def kv_file(layers, n_kv, d, heads, meta):
    """heads[l][h] = list of positions; keys/values are small distinct numbers."""
    m = json.dumps(meta).encode()
    b = b"CKVCACHE" + struct.pack("<II", 1, len(m)) + m + struct.pack("<III", layers, n_kv, d)
    for l in range(layers):
        for h in range(n_kv):
            pos = heads[l][h]
            b += struct.pack("<I", len(pos)) + struct.pack("<%di" % len(pos), *pos)
            b += f32([0.25 * (p + h + l) + j for p in pos for j in range(d)])
            b += f32([-0.5 * (p + h) - j for p in pos for j in range(d)])
    hsh = 0xCBF29CE484222325
    for c in b:
        hsh = ((hsh ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return b + struct.pack("<Q", hsh)


def main():
    # safetensors
    out("safetensors", "f32_f16_bf16.safetensors", safetensors([
        ("w", "F32", [3, 4], f32([0.5 * i - 2 for i in range(12)])),
        ("h", "F16", [2, 3], struct.pack("<6H", 0x3C00, 0xC100, 0x3800, 0x7BFF, 0x0400, 0x0001)),
        ("b", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0xC020, 0x4049, 0x7F7F)),
        ("i", "I64", [2], struct.pack("<2q", 7, -9)),
        ("s", "F32", [], f32([42.25])),
        ("e", "F32", [0, 4], b""),
    ], meta={"format": "pt"}))
    out("safetensors", "empty.safetensors", safetensors([]))
    out("safetensors", "padded.safetensors", safetensors([("x", "F32", [2, 2], f32([1, 2, 3, 4]))], pad=16))
    out("safetensors", "layer.safetensors", safetensors([
        ("model.layers.0.self_attn.q_proj.weight", "F32", [8, 4], f32([0.01 * i for i in range(32)])),
        ("model.norm.weight", "BF16", [4], struct.pack("<4H", 0x3F80, 0x3F80, 0x3F80, 0x3F80)),
    ]))
    # config.json (+ NUL + generation_config.json)
    for m in sorted(os.listdir(os.path.join(FIX, "models"))):
        c = os.path.join(FIX, "models", m, "config.json")
        if not os.path.isfile(c):
            continue
        data = open(c, "rb").read()
        g = os.path.join(FIX, "models", m, "generation_config.json")
        if os.path.isfile(g):
            data += b"\0" + open(g, "rb").read()
        out("config", m + ".json", data)
    # JSONL datasets
    for n in ("longbench_mini.jsonl", "bad.jsonl"):
        out("dataset", n, open(os.path.join(FIX, "eval", n), "rb").read())
    out("dataset", "grouped.jsonl",
        b'{"context": "abc", "questions": [{"question": "q1", "answers": ["a"]}, "q2"], "answers": [["x"], ["y"]],'
        b' "task": "qa", "metric": "qa_f1", "all_classes": ["a", "b"], "max_new_tokens": 4, "_id": 7}\n'
        b'{"context": "abc", "input": "q3", "outputs": ["c"], "task": "qa", "metric": "qa_f1"}\n\n')
    # cache files: 2 layers x 2 KV heads x 4 dims, 16-token context (the target's shape); the first
    # byte is the target's mode (bit 0: fix the checksum, bit 1: uncompressed cache)
    full = [[list(range(16))] * 2] * 2
    comp = [[[0, 3, 15], [1]], [[], list(range(2, 16, 2))]]
    out("kv_file", "full.ckv", b"\x02" + kv_file(2, 2, 4, full, {"format": "ckv kv cache", "context_len": 16, "press": "none"}))
    out("kv_file", "compressed.ckv", b"\x00" + kv_file(2, 2, 4, comp, {"context_len": 16, "press": "snapkv"}))
    out("kv_file", "compressed_fix.ckv", b"\x01" + kv_file(2, 2, 4, comp, {}))


if __name__ == "__main__":
    main()
