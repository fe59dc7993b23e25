#!/usr/bin/env python3
"""CPU prefill and decode speed of clawmine next to transformers, same machine, same threads.

Both run the same F32 checkpoint: the default model (NVFP4) with every linear
dequantized exactly to F32 (written once to --work). Prefill: a prompt of
--prompt random token ids, tokens per second over the whole prompt. Decode:
--decode greedy tokens after it (EOS ignored), tokens per second. transformers
runs DeepseekV4ForCausalLM (fp32, eager, KV cache on, torch.set_num_threads);
clawmine runs `clawmine generate --tokens ... --ignore-eos -t N`. Each side runs
--repeat times, alternating, and the best run is kept (the machine may be shared).

Needs torch, transformers and safetensors (a tool's virtual environment, never
the engine's):  python3 -m venv .venv-bench && .venv-bench/bin/pip install torch transformers safetensors
Run:  .venv-bench/bin/python3 tools/bench_cpu_transformers.py --clawmine build/clawmine
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def nvfp4_to_f32(packed, scale, scale_2):
    """U8 [N, K/2] (low nibble = even k) x E4M3 [N, K/16] x f32 scalar -> f32 [N, K], exact."""
    lo, hi = (packed & 0xF).long(), (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)
    return E2M1[codes] * scale.float().repeat_interleave(16, dim=1) * scale_2.float()


def make_f32_copy(src, dst):
    """Writes dst: the checkpoint of src with every NVFP4 linear dequantized and everything in F32."""
    if os.path.exists(os.path.join(dst, "config.json")):
        return
    os.makedirs(dst, exist_ok=True)
    index = json.load(open(os.path.join(src, "model.safetensors.index.json")))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(src, shard), framework="pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
    out = {}
    for k, v in tensors.items():
        if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base and base + ".weight_scale" in tensors:
            out[k] = nvfp4_to_f32(v, tensors[base + ".weight_scale"], tensors[base + ".weight_scale_2"])
        else:
            out[k] = v.float() if v.is_floating_point() else v
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), dst)


def bench_transformers(model_dir, ids, n_decode):
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(x, use_cache=True)
        t1 = time.perf_counter()
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(n_decode):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t2 = time.perf_counter()
    return len(ids) / (t1 - t0), n_decode / (t2 - t1)


def bench_clawmine(binary, model_dir, ids, n_decode, threads):
    cmd = [binary, "generate", "-m", model_dir, "--tokens", ",".join(map(str, ids)), "-n", str(n_decode),
           "--ignore-eos", "-t", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"prompt: (\d+) tokens, ([\d.]+) tok/s \| generation: (\d+) tokens, ([\d.]+) tok/s", r.stderr)
    if not m:
        raise SystemExit("clawmine printed no speed line:\n" + r.stderr)
    return float(m.group(2)), float(m.group(4))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clawmine", default="build/clawmine")
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--work", default="/tmp/clawmine-bench-f32")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    make_f32_copy(a.model, a.work)
    vocab = json.load(open(os.path.join(a.work, "config.json")))["vocab_size"]
    rng = random.Random(1)
    ids = [rng.randrange(2, vocab) for _ in range(a.prompt)]
    cm, hf = [], []
    for _ in range(a.repeat):
        cm.append(bench_clawmine(a.clawmine, a.work, ids, a.decode, a.threads))
        hf.append(bench_transformers(a.work, ids, a.decode))
    res = {
        "threads": a.threads, "prompt_tokens": a.prompt, "decode_tokens": a.decode,
        "clawmine_prefill_tok_s": max(p for p, _ in cm), "clawmine_decode_tok_s": max(d for _, d in cm),
        "transformers_prefill_tok_s": max(p for p, _ in hf), "transformers_decode_tok_s": max(d for _, d in hf),
        "runs": {"clawmine": cm, "transformers": hf},
    }
    res["prefill_ratio"] = res["clawmine_prefill_tok_s"] / res["transformers_prefill_tok_s"]
    res["decode_ratio"] = res["clawmine_decode_tok_s"] / res["transformers_decode_tok_s"]
    print(f"| engine | prefill {a.prompt} tok (tok/s) | decode (tok/s) |\n|---|---:|---:|")
    print(f"| clawmine | {res['clawmine_prefill_tok_s']:.0f} | {res['clawmine_decode_tok_s']:.1f} |")
    print(f"| transformers {torch.__version__} | {res['transformers_prefill_tok_s']:.0f} | "
          f"{res['transformers_decode_tok_s']:.1f} |")
    print(f"ratio: prefill {res['prefill_ratio']:.2f}x, decode {res['decode_ratio']:.2f}x")
    if a.json_file:
        json.dump(res, open(a.json_file, "w"), indent=2)


if __name__ == "__main__":
    main()
