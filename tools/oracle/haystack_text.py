#!/usr/bin/env python3
"""haystack_text.py - writes data/haystack/*.txt (embedded at build time by cmake/embed_haystack.cmake), the
real-prose haystack and the word lists of
`ckv eval`'s RULER-style task generators, from a public-domain text that a Debian package ships:

    "The Devil's Dictionary" by Ambrose Bierce (1911; public domain, copyright expired), as packaged by
    Debian in `dict-devil` (its debian/copyright: "The Devil's Dictionary is in the public domain, its
    copyright has expired").

What it derives (standard library only):
  - the prose: everything from the preface on, italics markers (_word_) removed, every run of
    whitespace collapsed to one space (the form the generators split into words, as RULER does with
    its essay haystack);
  - nouns, adjectives and verbs: the lowercase one-word headwords marked n., adj., v./v.t./v.i.
    (keys of the needle tasks are adjective-noun pairs, as RULER builds them from its word lists;
    common-words extraction draws from nouns + adjectives + verbs);
  - a vocabulary: every distinct lowercase alphabetic word of 3+ letters in the prose (common-words
    extraction at long lengths needs more distinct words than the headwords give).

usage:
    tools/oracle/haystack_text.py                 # downloads dict-devil with apt-get (no install)
    tools/oracle/haystack_text.py --dict FILE     # or reads devil.dict.dz / the unpacked text
"""
import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "data", "haystack")


def fetch_dict():
    """Downloads the Debian package (apt-get download: no root, no install) and unpacks the dictionary."""
    tmp = tempfile.mkdtemp(prefix="dict-devil.")
    subprocess.run(["apt-get", "download", "dict-devil"], cwd=tmp, check=True)
    deb = [f for f in os.listdir(tmp) if f.endswith(".deb")][0]
    subprocess.run(["dpkg-deb", "-x", deb, "x"], cwd=tmp, check=True)
    version = deb.split("_")[1]
    return os.path.join(tmp, "x", "usr", "share", "dictd", "devil.dict.dz"), version


def read_text(path):
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":  # dictzip is gzip
        data = gzip.decompress(data)
    return data.decode("ascii")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dict", help="devil.dict.dz (or its text); default: apt-get download dict-devil")
    ap.add_argument("--package-version", default=None)
    args = ap.parse_args()
    if args.dict:
        path, version = args.dict, args.package_version or "unknown"
    else:
        path, version = fetch_dict()
    text = read_text(path)

    start = text.index("PREFACE")
    body = text[start + len("PREFACE"):]
    body = body.rstrip()
    if body.endswith("abcdefghijklmnopqrstuvwxyz"):  # dictfmt's alphabet line
        body = body[: -len("abcdefghijklmnopqrstuvwxyz")]
    prose = " ".join(body.replace("_", "").split())

    heads = re.findall(r"^([A-Z][A-Z'\-]+), (n|adj|v\.t|v\.i|v)\.", body, re.M)
    def words_of(kinds):
        return sorted({h.lower() for h, k in heads if k in kinds and re.fullmatch(r"[A-Z]+", h)})
    nouns = words_of({"n"})
    adjectives = words_of({"adj"})
    verbs = words_of({"v", "v.t", "v.i"})
    vocabulary = sorted({w for w in re.findall(r"[a-z]+", prose.lower()) if len(w) >= 3})

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "essay.txt"), "w") as f:
        f.write(prose)
    for name, words in (("nouns", nouns), ("adjectives", adjectives), ("verbs", verbs), ("vocabulary", vocabulary)):
        with open(os.path.join(OUT, name + ".txt"), "w") as f:
            f.write("".join(w + "\n" for w in words))
    with open(os.path.join(OUT, "SOURCE"), "w") as f:
        f.write("The Devil's Dictionary by Ambrose Bierce (1911), public domain (copyright expired), as shipped by\n"
                "the Debian package dict-devil %s; extracted by tools/oracle/haystack_text.py.\n" % version)
    print("wrote %s: %d bytes of prose, %d nouns, %d adjectives, %d verbs, %d vocabulary words"
          % (os.path.relpath(OUT, ROOT), len(prose), len(nouns), len(adjectives), len(verbs), len(vocabulary)))

if __name__ == "__main__":
    sys.exit(main())
