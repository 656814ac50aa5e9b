#!/usr/bin/env python3
"""tokenizer_corpus.py - the tokenizer parity fixtures.

1. Builds the corpus (deterministic, fixed seed): >= 2,000 strings over English, 27 other scripts,
   CJK, emoji, code, numbers, runs of spaces/newlines/tabs, special-token text, casing and
   contractions, Unicode normalization cases, control characters, long texts, and invalid UTF-8
   byte strings. Written to tests/fixtures/tokenizer/corpus.jsonl:
       {"i": N, "cat": CATEGORY, "text": STR}      or      {"i": N, "cat": "invalid_utf8", "hex": HEX}
2. For every tokenizer present under models/tokenizers/<name>/ (tools/models/fetch_tokenizers.sh
   puts them there), records what Hugging Face `tokenizers` does, in
   tests/fixtures/tokenizer/<name>.ids.jsonl: a header line
       {"tokenizer": name, "tokenizers_version": V, "sha256": of tokenizer.json, "n": count,
        "special_pre": [ids], "special_post": [ids]}
   then one line per corpus string
       {"i": N, "ids": [...]}  plus, only where they apply:
       "dec": HF decode(ids) when it differs from the text, "dec_skip": decode with
       skip_special_tokens=True when it differs from "dec".
   ids are encode(text, add_special_tokens=False); encode(add_special_tokens=True) is checked to be
   special_pre + ids + special_post for every string. Invalid UTF-8 strings are encoded the way a
   Python caller must pass them: bytes.decode("utf-8", errors="replace").

Run from the repository root with the oracle venv (tokenizers installed):
    .venv-oracle/bin/python tools/oracle/tokenizer_corpus.py [--only NAME ...] [--corpus-only]
"""
import argparse
import hashlib
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
MODELS = os.path.join(ROOT, "models", "tokenizers")
NAMES = ["llama3.2", "llama3", "qwen2.5", "qwen3", "mistral-v3", "mistral-v3-legacy", "smollm2"]

WORDS = ("the of and to in is was for that with as on by at from his her they this be are or an which "
         "had not but have all were when there can been has more one their will would so if no out time "
         "people year only way about many then them these new some could may first other into after "
         "state world school house company program question government number night point home water "
         "room mother area money story fact month lot right study book eye job word business issue side "
         "kind head service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door "
         "health person art war history party result change morning reason research girl guy moment air "
         "teacher force education tokenizer Llama Qwen Mistral transformer attention cache eviction GPU "
         "don't can't I'm you're we've they'll she'd it's isn't won't O'Neil rock'n'roll").split()

SENTENCES = {
    "fr": "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ? Ça coûte 12,50 €.",
    "de": "Größere Übungen für Straßenbahnfahrer: Äpfel, Öl und Füße. Das Mädchen heißt Jürgen?",
    "es": "¿Dónde está la biblioteca? ¡Qué niño tan pequeño! El pingüino comió ñoquis.",
    "pt": "A ação da população não é só coração; são milhões de irmãos.",
    "it": "Perché è così difficile? Là c'è un caffè già pronto.",
    "pl": "Zażółć gęślą jaźń. Łódź jest pięknym miastem.",
    "cs": "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "tr": "Işık ılık süt içti; İstanbul'da şoför çay ağacı gördü.",
    "vi": "Tiếng Việt có dấu: người, được, những, không, trường học.",
    "ru": "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "uk": "Ґанок їжака: щирі слова й обіцянки є в кожного.",
    "el": "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    "ar": "صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت. مرحبا بالعالم ١٢٣",
    "he": "דג סקרן שט בים מאוכזב ולפתע מצא חברה. שלום עולם",
    "fa": "زبان فارسی زیباست؛ کتاب‌ها را بخوانید.",
    "hi": "नमस्ते दुनिया! हिन्दी में लिखा गया वाक्य। ०१२३४",
    "bn": "আমি বাংলায় গান গাই। ১২৩ টাকা",
    "ta": "யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்",
    "th": "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "ka": "ქართული ენა ძალიან ლამაზია.",
    "hy": "Բարեւ աշխարհ։ Հայերեն լեզու։",
    "am": "ሰላም ለዓለም። አማርኛ ቋንቋ።",
    "ko": "다람쥐 헌 쳇바퀴에 타고파. 안녕하세요, 세계!",
    "ja": "いろはにほへと ちりぬるを。東京特許許可局、カタカナとひらがな。",
    "zh": "我能吞下玻璃而不伤身体。中华人民共和国成立于1949年。繁體中文測試。",
    "my": "မင်္ဂလာပါ ကမ္ဘာလောက",
    "km": "សួស្តី​ពិភពលោក",
}

CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);",
    "#include <stdio.h>\nint main(void) { printf(\"hello\\n\"); return 0; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\"><p>Hello &amp; welcome</p></div>",
    "if [ -f \"$HOME/.bashrc\" ]; then source ~/.bashrc; fi",
    "regex = r'^(?P<user>[\\w.+-]+)@(?P<host>[\\w-]+\\.)+[a-z]{2,}$'",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![0; 16];\n    Ok(())\n}",
    "    \n\t\tindented with tabs\n        and spaces\n",
    "x=1;y=2;z=x+y;print(z)",
    "git commit -m 'fix: handle \\r\\n line endings'",
    "a_b_c __init__ __name__ == '__main__' self.__dict__",
    "std::vector<std::pair<int, std::string>> v{{1, \"a\"}};",
    "SELECT * FROM t; -- comment\n/* block */",
    "lambda x: x if x else None  # noqa: E731",
    "matrix[i][j] += alpha * (x[i] - mu) / sigma;",
    "<|fim_prefix|>def foo():<|fim_suffix|>\n<|fim_middle|>",
    "@decorator(arg=1)\nclass A(B, metaclass=M): pass",
]

SPECIAL_TEXTS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_5|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
    "<|fim_prefix|>", "<|vision_start|>", "<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]", "<repo_name>", "<file_sep>", "<jupyter_code>",
]


def gen_corpus():
    rng = random.Random(20240531)
    items = []

    def add(cat, text):
        items.append({"cat": cat, "text": text})

    # English
    for _ in range(420):
        n = rng.randint(1, 24)
        words = [rng.choice(WORDS) for _ in range(n)]
        s = " ".join(words)
        r = rng.random()
        if r < 0.3:
            s = s.capitalize() + rng.choice([".", "!", "?", "...", ";", ":", ""])
        elif r < 0.4:
            s = s.upper()
        elif r < 0.5:
            s = s.title()
        add("english", s)
    # other scripts: whole sentences, fragments, mixed with English
    for lang, s in SENTENCES.items():
        add("script_" + lang, s)
        words = s.split(" ")
        for _ in range(14):
            a = rng.randint(0, len(words) - 1)
            b = rng.randint(a, min(len(words), a + 6))
            frag = " ".join(words[a:b + 1])
            if rng.random() < 0.3:
                frag = rng.choice(WORDS) + " " + frag + " " + rng.choice(WORDS)
            add("script_" + lang, frag)
    # CJK and kana/hangul random runs
    ranges = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3400, 0x4DBF),
              (0xFF01, 0xFF5E), (0x3000, 0x303F), (0x20000, 0x2A6DF)]
    for _ in range(160):
        lo, hi = rng.choice(ranges)
        n = rng.randint(1, 20)
        s = "".join(chr(rng.randint(lo, hi)) for _ in range(n))
        if rng.random() < 0.3:
            s += rng.choice(["。", "、", "！", " ", "abc", "123"])
        add("cjk", s)
    # emoji
    emoji = ["😀", "😂", "🥲", "👍", "👍🏽", "❤️", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🏳️‍🌈", "#️⃣", "1️⃣",
             "🤖", "🚀", "☕", "✔", "©", "™", "🫠", "🪿", "\U0001F9D1\u200D\U0001F52C", "😶‍🌫️"]
    for _ in range(170):
        n = rng.randint(1, 6)
        parts = [rng.choice(emoji) for _ in range(n)]
        sep = rng.choice(["", " ", "  ", "\n"])
        s = sep.join(parts)
        if rng.random() < 0.4:
            s = rng.choice(WORDS) + " " + s + rng.choice(["", "!", " ok"])
        add("emoji", s)
    # code
    for snippet in CODE:
        add("code", snippet)
    idents = ["foo", "bar_baz", "camelCase", "SCREAMING_CASE", "x1", "_private", "i", "j2k", "HTTPServer", "μ"]
    for _ in range(200):
        k = rng.randint(0, 5)
        a, b = rng.choice(idents), rng.choice(idents)
        lit = rng.choice(["None", "True", "[]", "{}", '"s"'])
        s = [f"{a} = {b}({rng.randint(0, 999)})", f"if ({a} != {b}) {{ return -1; }}", f"{a}.{b}[{rng.randint(0, 9)}]",
             f"#define {a.upper()} 0x{rng.randint(0, 65535):04X}", f"{a}+={b}*{rng.random():.3f};",
             f"    {a}: {b} = {lit}"][k]
        add("code", s)
    # numbers
    for _ in range(230):
        k = rng.randint(0, 9)
        if k == 0:
            s = str(rng.randint(0, 10 ** rng.randint(1, 18)))
        elif k == 1:
            s = f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
        elif k == 2:
            s = f"{rng.randint(1, 999):,}" + "," + f"{rng.randint(0, 999):03d}"
        elif k == 3:
            s = f"{rng.uniform(0, 10):.5e}"
        elif k == 4:
            s = f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        elif k == 5:
            s = f"+1 ({rng.randint(200, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
        elif k == 6:
            digits = rng.choice(["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "๐๑๒๓๔๕๖๗๘๙", "⓪①②③④⑤⑥⑦⑧⑨"])
            s = "".join(rng.choice(digits) for _ in range(rng.randint(1, 8)))
        elif k == 7:
            s = rng.choice(["Ⅻ", "ⅷ", "½", "¾", "²³", "x²+y²=z²", "10⁻⁹", "₁₂₃"]) + " " + str(rng.randint(0, 99))
        elif k == 8:
            s = f"Version {rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)} costs ${rng.randint(1, 9999)}.{rng.randint(0, 99):02d}"
        else:
            s = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
        add("numbers", s)
    # whitespace runs
    ws = [" ", "  ", "   ", "\n", "\n\n", "\t", "\t\t", "\r\n", "\r", " \n", "\n ", "\u00a0", "\u3000", "\u2028",
          "\u0085", "\u200b", "\u2009", "\x0b", "\x0c", "    "]
    for _ in range(220):
        n = rng.randint(1, 6)
        parts = []
        for _ in range(n):
            parts.append("".join(rng.choice(ws) for _ in range(rng.randint(1, 4))))
            if rng.random() < 0.7:
                parts.append(rng.choice(WORDS + ["日本", "😀", "123", "!"]))
        add("whitespace", "".join(parts))
    for s in [" ", "  ", "\n", "\t", "\r\n", " " * 17, "\n" * 9, "\t \t \n", "a  b", "a\n\nb", " leading", "trailing ",
              "  both  ", "\n\nx", "x\n\n", "\u3000\u3000x"]:
        add("whitespace", s)
    # special-token text
    for _ in range(180):
        t1, t2 = rng.choice(SPECIAL_TEXTS), rng.choice(SPECIAL_TEXTS)
        k = rng.randint(0, 7)
        w = rng.choice(WORDS)
        s = [f"{t1}{w}", f"{w}{t1}", f"{t1} {w} {t2}", f"{t1}{t2}", f"{w} {t1}\n{w}", f"  {t1}  ",
             t1[:-1] + " " + w, f"<{t1}>"][k]
        add("special", s)
    add("special", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>")
    add("special", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    add("special", "<s>[INST] What is 2+2? [/INST] 4</s>")
    add("special", "<s>[INST] What is 2+2?[/INST]")
    # casing and contractions (the Llama 3 / Qwen regex has (?i:'s|'t|...))
    for _ in range(110):
        w = rng.choice(["I", "you", "WE", "They", "she", "IT", "John", "dog", "ſ"])
        c = rng.choice(["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'Ve", "'m", "'M", "'ll", "'LL", "'d", "'D",
                        "'ſ", "’s", "'x"])
        add("contractions", w + c + rng.choice(["", " ", " go", "!", "'s"]))
    # Unicode normalization and marks
    norm = ["e\u0301", "é", "A\u030a", "Å", "\u212b", "\u1100\u1161\u11a8", "각", "ﬁ", "ﬃ", "Ｆｕｌｌ", "㍿", "①",
            "n\u0303", "\u0928\u093f", "o\u0308\u0304", "\u1e9b\u0323", "Ω", "\u2126", "K", "\u212a", "ǆ", "ﾊﾟ"]
    for _ in range(150):
        n = rng.randint(1, 5)
        s = "".join(rng.choice(norm + [" ", "x", "Y"]) for _ in range(n))
        add("normalization", s)
    # random code points from assigned blocks
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0x1F300, 0x1F64F), (0x2000, 0x206F), (0x2190, 0x22FF), (0x300, 0x36F), (0xE000, 0xE0FF),
              (0x10000, 0x1007F), (0x1D400, 0x1D4FF)]
    for _ in range(150):
        lo, hi = rng.choice(blocks)
        add("random_unicode", "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 16))))
    # single characters and control characters
    for c in range(0, 128):
        add("ascii", chr(c))
    for c in [0x80, 0x85, 0x9F, 0xA0, 0xAD, 0xFF, 0x100, 0x2028, 0x2029, 0xFEFF, 0xFFFD, 0xFFFF, 0x10FFFF, 0x1F600]:
        add("single", chr(c))
    add("edge", "")
    # long texts
    for _ in range(10):
        paras = []
        for _ in range(rng.randint(5, 12)):
            paras.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + ".")
            if rng.random() < 0.5:
                paras.append(rng.choice(list(SENTENCES.values())))
        add("long", "\n\n".join(paras))
    # invalid UTF-8 byte strings
    bad = [b"\xff", b"\xc0\x80", b"\xe4\xb8", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80\x80", b"\xf0\x9f\x98",
           b"\xc3", b"\xe2\x82", b"\xfe\xfe"]
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(1, 4)):
            parts.append(rng.choice(WORDS).encode())
            parts.append(rng.choice(bad))
        items.append({"cat": "invalid_utf8", "bytes": b" ".join(parts) if rng.random() < 0.5 else b"".join(parts)})
    out = []
    for i, it in enumerate(items):
        if "bytes" in it:
            out.append({"i": i, "cat": it["cat"], "hex": it["bytes"].hex()})
        elif "\x00" in it["text"]:  # JSON readers that stop at NUL get the bytes as hex too
            out.append({"i": i, "cat": it["cat"], "text": it["text"], "hex": it["text"].encode().hex()})
        else:
            out.append({"i": i, "cat": it["cat"], "text": it["text"]})
    return out


def text_of(item):
    if "hex" in item:
        return bytes.fromhex(item["hex"]).decode("utf-8", errors="replace")
    return item["text"]


def record(name, corpus):
    from tokenizers import Tokenizer, __version__ as tv
    path = os.path.join(MODELS, name, "tokenizer.json")
    if not os.path.exists(path):
        print(f"[tokenizer_corpus] {name}: {path} missing (run tools/models/fetch_tokenizers.sh); skipped")
        return
    tok = Tokenizer.from_file(path)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    empty = tok.encode("", add_special_tokens=True).ids
    # the post-processor's tokens: encode a probe with and without special tokens
    probe_plain = tok.encode("a", add_special_tokens=False).ids
    probe_full = tok.encode("a", add_special_tokens=True).ids
    k = probe_full.index(probe_plain[0]) if probe_plain else 0
    pre, post = probe_full[:k], probe_full[k + len(probe_plain):]
    assert empty == pre + post, (name, empty, pre, post)
    lines = []
    n_rt = 0
    for item in corpus:
        text = text_of(item)
        ids = tok.encode(text, add_special_tokens=False).ids
        full = tok.encode(text, add_special_tokens=True).ids
        assert full == pre + ids + post, (name, item["i"])
        rec = {"i": item["i"], "ids": ids}
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != text:
            rec["dec"] = dec
        else:
            n_rt += 1
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        if dec_skip != dec:
            rec["dec_skip"] = dec_skip
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    header = {"tokenizer": name, "tokenizers_version": tv, "sha256": sha, "n": len(corpus), "special_pre": pre,
              "special_post": post, "generator": "tools/oracle/tokenizer_corpus.py"}
    out = os.path.join(FIX, f"{name}.ids.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        f.write("\n".join(lines) + "\n")
    print(f"[tokenizer_corpus] {name}: {len(corpus)} strings, {n_rt} round-trip exactly, "
          f"{os.path.getsize(out) // 1024} KiB -> {os.path.relpath(out, ROOT)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--corpus-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(FIX, exist_ok=True)
    corpus = gen_corpus()
    assert len(corpus) >= 2000, len(corpus)
    path = os.path.join(FIX, "corpus.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for item in corpus:
            f.write(json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n")
    size = os.path.getsize(path)
    print(f"[tokenizer_corpus] corpus: {len(corpus)} strings, {size // 1024} KiB -> {os.path.relpath(path, ROOT)}")
    assert size < 1 << 20, "corpus must stay under 1 MB"
    if args.corpus_only:
        return
    for name in args.only or NAMES:
        record(name, corpus)


if __name__ == "__main__":
    sys.exit(main())
