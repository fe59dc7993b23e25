"""`clawmine serve --mtp K` through the official `openai` client: a copy of the default model with an
MTP block built from its own layers (layer 0's attention and experts, layer 2's routing bias, random
e_proj/h_proj, the final norm and HC head; the block is untrained, so few drafts are accepted, but every
draft goes through drafting, verification and rollback), served with and without MTP: greedy and
seeded completions, alone and 8 at once, plain and streamed, give the same text; /metrics counts the
drafts; asking for MTP on a copy without the block is a startup error naming it.

Run: CLAWMINE_BIN=build/clawmine CLAWMINE_MODEL=models/default python -m pytest -q tests/server_mtp_test.py
"""
import asyncio
import json
import os
import random
import shutil
import struct
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_test import BIN, MODEL, Server  # noqa: E402


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for k, (dtype, shape, b) in tensors.items():
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16_random(rows, cols, scale, seed):
    rng = random.Random(seed)
    out = bytearray()
    for _ in range(rows * cols):
        out += struct.pack("<f", rng.uniform(-scale, scale))[2:4]  # the upper half of an f32: bf16
    return bytes(out)


def copy_without_mtp(dst):
    """The default model's files without any MTP block it has (shards holding only mtp.* are left out)."""
    ts = {}
    for name in sorted(os.listdir(MODEL)):
        src = os.path.join(MODEL, name)
        if name.endswith(".safetensors"):
            t = read_safetensors(src)
            if all(k.startswith("model.mtp.") for k in t):
                continue
            ts.update(t)
        shutil.copy(src, dst / name)
    index = dst / "model.safetensors.index.json"
    if index.exists():
        j = json.loads(index.read_text())
        j["weight_map"] = {k: v for k, v in j["weight_map"].items() if not k.startswith("model.mtp.")}
        index.write_text(json.dumps(j))
    return ts


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp_default")
    ts = copy_without_mtp(d)
    D = ts["model.norm.weight"][1][0]
    block = {}
    for k, v in ts.items():
        if k.startswith("model.layers.0.") and not k.endswith("tid2eid"):
            block["model.mtp.0." + k[len("model.layers.0."):]] = v
    block["model.mtp.0.ffn.gate.bias"] = ts["model.layers.2.ffn.gate.bias"]
    block["model.mtp.0.e_proj.weight"] = ("BF16", [D, D], bf16_random(D, D, 0.05, 1))
    block["model.mtp.0.h_proj.weight"] = ("BF16", [D, D], bf16_random(D, D, 0.05, 2))
    for n in ("enorm", "hnorm", "norm"):
        block[f"model.mtp.0.{n}.weight"] = ts["model.norm.weight"]
    for n in ("fn", "base", "scale"):
        block[f"model.mtp.0.hc_head_{n}"] = ts[f"model.hc_head.hc_{n}"]
    write_safetensors(d / "model-mtp.safetensors", block)
    index = d / "model.safetensors.index.json"
    if index.exists():
        j = json.loads(index.read_text())
        j["weight_map"].update({k: "model-mtp.safetensors" for k in block})
        index.write_text(json.dumps(j))
    return str(d)


def completions(srv, n=8):
    c = srv.client()

    def args(i):
        return dict(model="default", prompt=f"And the LORD said unto Moses, number {i}", max_tokens=24,
                    extra_body={"ignore_eos": True}, temperature=0 if i % 2 == 0 else 0.8, seed=50 + i)

    alone = [c.completions.create(**args(i)).choices[0].text for i in range(n)]

    async def together():
        ac = srv.aclient()
        rs = await asyncio.gather(*(ac.completions.create(**args(i)) for i in range(n)))
        return [r.choices[0].text for r in rs]

    streamed = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **args(1)) if ch.choices)
    return alone, asyncio.run(together()), streamed


def test_mtp_serves_the_same_text(mtp_model):
    opts = ("--max-seqs", "4", "--max-step-tokens", "64", "--ctx", "512", "--device", "cpu", "--served-model-name",
            "default")
    plain = Server(*opts, model=mtp_model)
    try:
        want = completions(plain)
        assert plain.metric("spec_decode_num_drafts_total") == 0
    finally:
        plain.stop()
    spec = Server(*opts, "--mtp", "3", model=mtp_model)
    try:
        got = completions(spec)
        drafts = spec.metric("spec_decode_num_drafts_total")
        drafted = spec.metric("spec_decode_num_draft_tokens_total")
        accepted = spec.metric("spec_decode_num_accepted_tokens_total")
    finally:
        spec.stop()
    assert got == want
    assert len(set(want[0])) > 4
    assert drafts > 50 and drafted > 2 * drafts and 0 <= accepted <= drafted


def test_mtp_without_a_block_is_a_startup_error(tmp_path):
    copy_without_mtp(tmp_path)
    r = subprocess.run([BIN, "serve", "-m", str(tmp_path), "--port", "0", "--mtp", "2", "--device", "cpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "no MTP weights" in r.stderr, r.stderr
