#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/ from the repository's real files, minimized
(tests/data, models/default). Run from the repository root: python3 fuzz/make_seeds.py
Seeds are small so that libFuzzer's default -max_len stays small and mutations stay fast."""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path, mode="rb"):
    with open(os.path.join(ROOT, path), mode) as f:
        return f.read()


def st_header(path):
    raw = read(path)
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def st_subset(path, limit, max_bytes=512):
    """A safetensors file holding the `limit` smallest tensors of `path`, with their real bytes."""
    header, data = st_header(path)
    meta = header.pop("__metadata__", None)
    small = sorted((e["data_offsets"][1] - e["data_offsets"][0], k) for k, e in header.items())
    out, buf = {}, b""
    if meta:
        out["__metadata__"] = meta
    for size, k in small[:limit]:
        if size > max_bytes:
            break
        e = dict(header[k])
        b, en = e["data_offsets"]
        e["data_offsets"] = [len(buf), len(buf) + en - b]
        buf += data[b:en]
        out[k] = e
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + buf


def index_subset(path, limit):
    j = json.loads(read(path))
    j["weight_map"] = dict(list(j["weight_map"].items())[:limit])
    return json.dumps(j, indent=2)


def safetensors():
    put("safetensors", "default_shard2.safetensors", st_subset("models/default/model-00002-of-00002.safetensors", 6))
    put("safetensors", "nvfp4_expected.safetensors", st_subset("tests/data/golden_quant_nvfp4/model-00001-of-00002.safetensors", 8))
    put("safetensors", "release_quant.safetensors", st_subset("tests/data/golden_quant_release/model-00001-of-00002.safetensors", 8))
    put("safetensors", "hf_text.safetensors", st_subset("tests/data/golden/hf_text/model.safetensors", 4))
    put("safetensors", "default.index.json", index_subset("models/default/model.safetensors.index.json", 8))
    put("safetensors", "release_quant.index.json", index_subset("tests/data/golden_quant_release/model.safetensors.index.json", 8))


def config():
    for d in ["models/default", "tests/data/golden/hf_hca_window", "tests/data/golden/hf_mixed_yarn",
              "tests/data/golden/hf_text", "tests/data/golden/release_real_ratios",
              "tests/data/golden_quant_nvfp4", "tests/data/golden_quant_release"]:
        put("config", d.replace("/", "_") + ".config.json", read(d + "/config.json"))
    put("config", "default.generation_config.json", read("models/default/generation_config.json"))


def mini_tokenizer(path, n_merges):
    """tokenizer.json with its structure intact but the BPE model cut to the byte alphabet plus
    the tokens of the first n_merges merges."""
    j = json.loads(read(path))
    m = j["model"]
    vocab = m["vocab"]
    merges = m["merges"][:n_merges]
    keep = set(list(vocab)[:256])
    for mg in merges:
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        keep.update([a, b, a + b])
    m["vocab"] = {k: v for k, v in vocab.items() if k in keep}
    m["merges"] = merges
    return j


def tokenizer_json():
    t = mini_tokenizer("tests/data/tokenizer/tokenizer.json", 40)
    put("tokenizer_json", "test_tokenizer.json", json.dumps(t, ensure_ascii=False))
    put("tokenizer_json", "test_tokenizer_with_config.json",
        json.dumps(t, ensure_ascii=False).encode() + b"\0" + read("tests/data/tokenizer/tokenizer_config.json"))
    d = mini_tokenizer("models/default/tokenizer.json", 40)
    put("tokenizer_json", "default_tokenizer.json",
        json.dumps(d, ensure_ascii=False).encode() + b"\0" + read("models/default/tokenizer_config.json"))
    # The post-processor path (BOS/EOS from TemplateProcessing when tokenizer_config.json is silent).
    d["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<｜begin▁of▁sentence｜>": {
                               "id": "<｜begin▁of▁sentence｜>", "ids": [0], "tokens": ["<｜begin▁of▁sentence｜>"]}}}
    put("tokenizer_json", "default_post_processor.json", json.dumps(d, ensure_ascii=False))


def tokenize():
    held = read("models/default/heldout.txt", "r").split("\n")
    put("tokenize", "heldout_1.txt", "\n".join(held[:3])[:600])
    put("tokenize", "heldout_2.txt", "\n".join(held[40:44])[:600])
    cases = json.loads(read("tests/data/tokenizer/cases.json"))
    texts = [c["text"] for c in cases if isinstance(c, dict) and isinstance(c.get("text"), str)] if isinstance(cases, list) else []
    for i, t in enumerate(sorted(set(texts), key=lambda s: -len(set(s)))[:6]):
        put("tokenize", f"case_{i}.txt", t[:400])
    enc = json.loads(read("tests/data/chat/dsv4_cases.json"))["encode"]
    put("tokenize", "chat_prompt.txt", enc[-1]["expected"][:800])
    put("tokenize", "invalid_utf8.bin", b"ok \xff\xfe caf\xc3\xa9 \xe4\xbd \x80 end <\xef\xbd\x9cUser")


def chat():
    cases = json.loads(read("tests/data/chat/dsv4_cases.json"))
    for c in cases["encode"]:
        opt = (1 if c["thinking_mode"] == "thinking" else 0) | (0 if c.get("drop_thinking", True) else 2) \
            | (0 if c.get("add_bos", True) else 4) | ({None: 0, "high": 1, "max": 2}.get(c.get("reasoning_effort"), 0) << 3)
        put("chat_encode", c["name"] + ".json", bytes([opt]) + json.dumps(c["messages"], ensure_ascii=False).encode())
    for c in cases["parse"]:
        opt = (1 if c["thinking_mode"] == "thinking" else 0) | (6 << 1)
        put("chat_parse", c["name"] + ".txt", bytes([opt]) + c["text"].encode())


def grammar():
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
              "kind": {"enum": ["a", "b"]}, "n": {"type": "array", "items": {"type": "integer"}}},
              "required": ["name"]}
    bodies = {
        "rf_json_object.json": {"response_format": {"type": "json_object"}},
        "rf_json_schema.json": {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema, "strict": True}}},
        "so_regex.json": {"structured_outputs": {"regex": "[a-c]{2,4}-[0-9]+"}},
        "so_choice.json": {"structured_outputs": {"choice": ["yes", "no", "caf\u00e9"]}},
        "so_grammar.json": {"structured_outputs": {"grammar": 'root ::= "ab" ("c" | "d")+ "!"'}},
        "guided_json_str.json": {"guided_json": json.dumps(schema)},
        "llama_grammar.json": {"grammar": 'root ::= item ("," item)*\nitem ::= [0-9]+'},
        "conflict.json": {"json_schema": {"type": "integer"}, "guided_regex": "a+"},
    }
    for i, (name, body) in enumerate(bodies.items()):
        put("grammar_request", name, bytes([i * 37 % 256]) + json.dumps(body).encode())


if __name__ == "__main__":
    safetensors()
    config()
    tokenizer_json()
    tokenize()
    chat()
    grammar()
