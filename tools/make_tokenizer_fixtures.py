#!/usr/bin/env python3
"""Build the small DeepSeek-style tokenizer and its expected encodings (tests/data/tokenizer/).

Why: clawmine's C++ tokenizer must agree with Hugging Face `tokenizers` exactly. This script
trains a few-thousand-token byte-level BPE with DeepSeek-V3/V4's pre-tokenizer configuration
(three Split regexes, then ByteLevel without regex) and DeepSeek's special tokens, and records
the ids `tokenizers` gives for a few hundred tricky strings. The C++ test (tests/test_tokenizer.cpp)
checks every one.

Output (committed):
  tokenizer.json, tokenizer_config.json  - the tokenizer (config as DeepSeek-V4: no BOS/EOS added)
  cases.json - [{"hex": input bytes, "text": str or null, "ids": [...], "ids_no_special": [...]}]
    ids            = encode with special tokens parsed   (tokenizers: encode(add_special_tokens=False))
    ids_no_special = special tokens encoded as text      (tokenizers: encode_special_tokens=True)
  Inputs that are not valid UTF-8 cannot be given to `tokenizers` (it takes str). For them the
  expected ids follow clawmine's documented rule: the bytes are decoded with surrogateescape;
  each undecodable byte is one pre-token (its byte-level token) and each valid run between them is
  encoded by `tokenizers` on its own.

Usage: python3 tools/make_tokenizer_fixtures.py [--out tests/data/tokenizer]
"""
import argparse
import glob
import gzip
import json
import os
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, Regex

# DeepSeek-V3/V4 tokenizer.json pre_tokenizer (as mirrored by llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM regex list).
DS_SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^""" + "\r\n" + r"""\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[""" + "\r\n" + r"""]*|\s*[""" + "\r\n" + r"""]+|\s+(?!\S)|\s+""",
]

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
SPECIALS = [
    "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜DSML｜tool_calls>",
    "</｜DSML｜tool_calls>", "｜DSML｜", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>",
    "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
]
# A non-special added token: recognised even when special tokens are not parsed.
NON_SPECIAL = ["<｜fim▁hole｜>"]

MULTILINGUAL = """
你好，世界！今天天气很好。我们一起去公园散步吧。机器学习和自然语言处理是人工智能的重要分支。
日本語のテキストです。ひらがなとカタカナと漢字を使います。東京は日本の首都です。
한국어 문장도 조금 있습니다. Ça va très bien, merci beaucoup! Übermäßig große Straße.
Привет, как дела? Это пример текста на русском языке. Ελληνικά γράμματα και λέξεις.
مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก
Numbers: 0 1 12 123 1234 12345 3.14159 2,718,281 1e-9 0x1F ٣٤٥ １２３ ²³
Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 1️⃣
def main(argv):\n    return {"key": [1, 2, 3]}  # comment\r\n\tif x != y: pass
"""


def training_text():
    texts = [MULTILINGUAL * 20]
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p):
            texts.append(open(p, encoding="utf-8", errors="ignore").read())
    for p in sorted(glob.glob("/usr/share/doc/python3/*.txt.gz")):
        texts.append(gzip.open(p, "rt", encoding="utf-8", errors="ignore").read())
    return texts


def build_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DS_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens(NON_SPECIAL)
    return tok


def tricky_strings(specials):
    s = [
        "", " ", "a", "Hello, world!", "Hello world", " hello", "hello ", "  leading and trailing  ",
        "don't can't I'LL we've she'd", "The quick brown fox jumps over the lazy dog.",
        "GNU General Public License version 3", "Copyright (C) 2007 Free Software Foundation, Inc.",
        "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "1,000,000", "x2y33z444w5555",
        "٣٤٥٦", "１２３４５", "²³⁴", "Ⅻ", "½¾", "0x1F2E", "v1.2.3-rc4", "2026-12-02T13:53:08Z",
        "  ", "   ", "a  b", "a   b", "a\tb", "\t\t", "\n", "\n\n", "\r\n", "a\r\nb", "a\r\n\r\nb",
        "line1\nline2\n", "  \n  \n", "x \n y", "tail   ", "\u00a0", "a\u00a0b", "\u3000全角", "\u2028",
        "a\u0085b", "a\u180eb", " \u180e\n", "zero\u200bwidth", "\ufeffbom", "\u000b\u000c", "a \u00a0 b", "end.\n\n\n",
        "你好世界", "日本語のテキスト", "カタカナ", "ひらがな", "한국어", "abc中文def", "中文123中文",
        "，。！？", "「引用」", "中文 English 混合", "漢字かなカナ", "ｶﾀｶﾅ", "㐀㐁", "𠀀𠀁",
        "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵🇺🇸", "1️⃣", "a👍b", "👍👍👍", "🧑🏿‍🚀",
        "e\u0301", "cafe\u0301", "n\u0303", "Z\u0351\u0352\u0353algo", "\u0301start", "नमस्ते",
        "مرحبا", "שָׁלוֹם", "สวัสดี", "Ελληνικά", "Привет", "Übermäßig", "ǅemal", "ﬁnance",
        "@user #tag $100 %20 ^_^ &amp; *bold* (x) [y] {z} <a> |b| ~c~ `d`", "!!!", "...", "?!",
        "x+=1;", "a->b", "::std", "// comment", "/* c */", "#include <vector>", "<html><body>",
        "email@example.com", "https://example.com/path?q=1&r=2#frag", "C:\\Windows\\path",
        "'quoted'", "\"double\"", "'s", "'t", "'re", "it's", "O'Neil", "___init___", "__x",
        "$\\frac{a}{b}$", "∑∫√∞≠≤", "→←↑↓", "€£¥₹", "©®™", "°C", "±×÷", "♠♥♦♣", "★☆",
        "<｜fim▁hole｜>", "a<｜fim▁hole｜>b", "<｜User｜", "｜User｜>", "<｜User｜><｜User｜>",
        "<think></think>", "<think>\nreasoning\n</think>\n\nanswer", "ab<think>cd", "<thinking>",
        "</think >", "<｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"f\">", "x｜DSML｜y",
        "<｜begin▁of▁sentence｜><｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi!<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>",
        "<｜▁pad▁｜><｜▁pad▁｜>", " <｜User｜> ", "\n<｜Assistant｜>\n",
    ]
    s += [sp for sp in specials]
    s += ["x" * 300, "ab" * 200, "1" * 50, " " * 40, "\n" * 20, "中" * 100, "😀" * 30]
    # Seeded random mixes of the pieces above (deterministic across runs).
    rng = random.Random(1234)
    pool = list(s)
    for _ in range(220):
        k = rng.randint(2, 5)
        s.append("".join(rng.choice(pool[:-7]) for _ in range(k)))
    out = [x.encode("utf-8") for x in s]
    # Invalid UTF-8 (bytes input).
    out += [b"\xff", b"\xfe\xff", b"abc\x80def", b"\xe4\xb8", b"\xe4\xb8\xad\xe6", b"\xc0\xaf",
            b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98", b"hello \xff world",
            b"123\x80456", b"\xe4\xb8\xe4\xb8\xad", b"<\xef\xbd\x9cUser\xef\xbd\x9c>\xff",
            b"\xff<\xef\xbd\x9cUser\xef\xbd\x9c>", b"  \x80  ", b"\x80\x81\x82\x83", b"\xc3",
            b"caf\xc3", b"\xa0\xa0", b"\n\xff\n"]
    return out


def encode_bytes(tok, data, special):
    """Expected ids for arbitrary bytes (see the module docstring for invalid UTF-8)."""
    tok.encode_special_tokens = not special
    text = data.decode("utf-8", "surrogateescape")
    byte_char = {b: c for b, c in zip(range(256), bytes_to_unicode())}
    ids, run = [], ""
    for ch in text:
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            if run:
                ids += tok.encode(run, add_special_tokens=False).ids
                run = ""
            ids.append(tok.token_to_id(byte_char[ord(ch) - 0xDC00]))
        else:
            run += ch
    if run:
        ids += tok.encode(run, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return ids


def bytes_to_unicode():
    """GPT-2 byte -> printable char table, as a list indexed by byte."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=4000)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = build_tokenizer(args.vocab_size)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    cfg = {"add_bos_token": False, "add_eos_token": False, "bos_token": {"content": BOS},
           "eos_token": {"content": EOS}, "pad_token": {"content": PAD},
           "model_max_length": 131072, "tokenizer_class": "LlamaTokenizerFast"}
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    cases = []
    for data in tricky_strings([BOS, EOS, PAD] + SPECIALS):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        cases.append({"hex": data.hex(), "text": text, "ids": encode_bytes(tok, data, True),
                      "ids_no_special": encode_bytes(tok, data, False)})
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=0)
    print(f"wrote {len(cases)} cases, vocab {tok.get_vocab_size()} to {args.out}")


if __name__ == "__main__":
    main()
