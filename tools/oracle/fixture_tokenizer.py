#!/usr/bin/env python3
"""fixture_tokenizer.py - writes a tiny byte-level BPE tokenizer.json for the fixture models, whose
vocabulary has 512 entries, so that text-level commands (`ckv eval`) can run on them in CI:

  ids 0..2    <unk>, <s> (bos, added in front by the post-processor, as Llama does), </s> (eos)
  ids 3..258  the 256 bytes (GPT-2 byte-to-unicode alphabet)
  ids 259..   BPE merges learned (deterministically, standard library only) from a small English
              corpus: RULER's task templates and noise sentence, and digits/words the tasks use.

Pre-tokenizer ByteLevel (GPT-2 regex, no prefix space), decoder ByteLevel: any UTF-8 text encodes.
The models are random, so the tokenizer only has to be valid and deterministic, not good.

usage: tools/oracle/fixture_tokenizer.py [--models llama_gqa ...]   (run by tools/oracle/regen.sh)
"""
import argparse
import collections
import json
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VOCAB = 512
SPECIALS = ["<unk>", "<s>", "</s>"]

CORPUS = """
Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about the
numbers afterwards. A special magic number is hidden within the following text. What is the special magic number for
the key mentioned in the provided text? The special magic number for the key mentioned in the provided text is
One of the special magic numbers for the key is: 1234567. One of the special magic words for the key is: apple.
The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.
Memorize and track the chain(s) of variable assignment hidden in the following text.
Question: Find all variables that are assigned the value 12345 in the text above. Answer: According to the chain(s) of
variable assignment in the text above, 5 variables are assigned the value 12345, they are: VAR ABCDE = VAR FGHIJ
Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear
most often. Question: What are the 10 most common words in the above list? Answer: The top 10 words that appear most
often in the list are: Read the following coded text and track the frequency of each coded word. Find the three most
frequently appeared coded words. Question: Do not provide any explanation. Please ignore the dots '....'. What are the
three most frequently appeared words in the above coded text? Answer: According to the coded text above, the three
most frequently appeared words are: Answer the question based on the given passages. Only give me the answer and do
not output any other words. The following are given passages. Passage 1: the river flows to the sea and the city
stands on its banks. Now, answer the question based on the story as concisely as you can.
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000
"""

PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(corpus, n_merges, b2u):
    words = collections.Counter(PAT.findall(corpus))
    seqs = {w: [b2u[b] for b in w.encode("utf-8")] for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]  # most frequent, ties by the pair itself
        merges.append(best)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


def build():
    b2u = bytes_to_unicode()
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    merges = train(CORPUS, VOCAB - len(vocab), b2u)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    assert len(vocab) <= VOCAB, len(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for i, t in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges],
        },
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["llama_gqa"])
    args = ap.parse_args()
    tok = build()
    text = json.dumps(tok, ensure_ascii=False, indent=1) + "\n"
    for m in args.models:
        path = os.path.join(ROOT, "tests", "fixtures", "models", m, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote %s (%d tokens, %d merges)" % (os.path.relpath(path, ROOT), len(tok["model"]["vocab"]),
                                                  len(tok["model"]["merges"])))
    try:  # a cross-check when Hugging Face tokenizers is installed (the oracle venv has it)
        from tokenizers import Tokenizer
        t = Tokenizer.from_str(text)
        s = "A special magic number is hidden: 7421337. The grass is green. héllo"
        ids = t.encode(s).ids
        assert ids[0] == 1 and t.decode(ids, skip_special_tokens=True) == s, (ids, t.decode(ids))
        print("checked with tokenizers %s: %d ids round-trip" % (__import__("tokenizers").__version__, len(ids)))
    except ImportError:
        pass


if __name__ == "__main__":
    sys.exit(main())
