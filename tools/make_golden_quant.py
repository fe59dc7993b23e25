#!/usr/bin/env python3
"""Makes the quantized golden fixtures (spec §9, §15.4): small random
DeepSeek-V4 models whose linears are stored quantized, plus the logits
transformers computes with the DEQUANTIZED weights (use_cache=False).

  golden_quant_nvfp4   transformers key/config spelling; NVIDIA ModelOpt NVFP4
                       (U8 E2M1 pairs + E4M3 per-16 weight_scale + F32 scalar
                       weight_scale_2 + input_scale) on attention wq_a/wq_b/wkv/
                       wo_a/wo_b, shared and routed experts; the rest F32; config
                       quantization_config {modelopt, NVFP4, group_size 16, ignore}.
  golden_quant_release DeepSeek release spelling (no `model.` prefix, embed.weight,
                       hc_head_fn, attn.kv_norm, compress_ratios with the MTP entry,
                       num_hash_layers, rope_scaling), two shards: FP8 E4M3 with
                       128x128 E8M0 `.scale` blocks on attention and shared experts,
                       MXFP4 routed experts (I8 E2M1 pairs + E8M0 `.scale` per 32),
                       everything else BF16; hidden 192 so FP8 blocks are ragged.

Every parameter and buffer is randomised with tools/make_golden.py's
randomize() (sinks, position biases, mHC base/scale, router bias, tid2eid with
distinct experts per token; 16 indexer heads), and a fixture whose cached
token-by-token logits disagree with the full forward (a top-k tie) is refused.

Layout of tests/data/golden_quant_<name>/: config.json,
model-0000i-of-0000n.safetensors, model.safetensors.index.json (so that
expected.safetensors beside them is not read as part of the model), and
expected.safetensors with `tokens` (I64 [T]) and `logits` (F32 [T, vocab]).

The quantizers here are written independently of the C++ ones (torch ops).
Run:  python3 tools/make_golden_quant.py [--out tests/data]
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import BASE, checked_logits, randomize, release_config, to_release, write_shards  # noqa: E402

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_codes(x):
    """fp32 -> E2M1 codes, round to nearest even (ties to the even code), saturating at 6."""
    a = x.abs()
    c = torch.full_like(a, 7, dtype=torch.int64)
    # Upper edges of codes 0..6: a <= edge picks the even code at a tie, a < edge the odd one.
    for code, edge, incl in [(6, 5.0, True), (5, 3.5, False), (4, 2.5, True), (3, 1.75, False),
                             (2, 1.25, True), (1, 0.75, False), (0, 0.25, True)]:
        c = torch.where(a <= edge if incl else a < edge, torch.full_like(c, code), c)
    return c + 8 * (x < 0).to(torch.int64)


def e2m1_value(codes):
    v = E2M1_GRID[codes & 7]
    return torch.where(codes >= 8, -v, v)


def pack(codes):
    """[N, K] codes -> [N, K/2] bytes, even index in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def pow2_ceil_exp(v):
    """ceil(log2(v)) exactly, for v > 0."""
    m, e = torch.frexp(v)
    return torch.where(m == 0.5, e - 1, e)


def quant_nvfp4(w):
    """ModelOpt NVFP4: returns (packed U8, E4M3 scales, scale_2, dequantized fp32)."""
    N, K = w.shape
    s2 = (w.abs().max() / (6.0 * 448.0)).to(torch.float32)
    blocks = w.reshape(N, K // 16, 16)
    sb = (blocks.abs().amax(-1) / 6.0 / s2).clamp(max=448.0).to(torch.float8_e4m3fn)
    dec = sb.to(torch.float32) * s2
    scaled = torch.where(dec[..., None] > 0, blocks / dec[..., None].clamp(min=1e-30), torch.zeros_like(blocks))
    codes = e2m1_codes(scaled).reshape(N, K)
    deq = (e2m1_value(codes).reshape(N, K // 16, 16) * sb.to(torch.float32)[..., None] * s2).reshape(N, K)
    return pack(codes), sb, s2, deq


def quant_mxfp4(w):
    """DeepSeek release experts: I8 packed E2M1, E8M0 scale per 32 (2^ceil(log2(amax/6)))."""
    N, K = w.shape
    blocks = w.reshape(N, K // 32, 32)
    amax = blocks.abs().amax(-1).clamp(min=2.0 ** -120)
    e = pow2_ceil_exp(amax / 6.0)
    scale = torch.ldexp(torch.ones_like(amax), e)
    codes = e2m1_codes(blocks / scale[..., None]).reshape(N, K)
    deq = (e2m1_value(codes).reshape(N, K // 32, 32) * scale[..., None]).reshape(N, K)
    e8 = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return pack(codes).view(torch.int8), e8, deq


def quant_fp8_block(w):
    """DeepSeek FP8: E4M3 weight, E8M0 scale per 128x128 block (ragged edges)."""
    N, K = w.shape
    nb, kb = math.ceil(N / 128), math.ceil(K / 128)
    pad = torch.zeros(nb * 128, kb * 128)
    pad[:N, :K] = w
    blocks = pad.reshape(nb, 128, kb, 128)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=2.0 ** -120)
    e = pow2_ceil_exp(amax / 448.0)
    scale = torch.ldexp(torch.ones_like(amax), e)
    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
    q = (w / full).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * full
    return q, (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu), deq


def is_target(key):
    """Default NVFP4/FP8 targets, as in clawmine quantize: attention, shared, routed experts."""
    k = key[len("model."):] if key.startswith("model.") else key
    parts = k.split(".")
    if len(parts) < 4 or parts[0] != "layers" or parts[-1] != "weight":
        return None
    mod = ".".join(parts[2:-1])
    if mod in ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b"):
        return "attn"
    if mod in ("ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3"):
        return "shared"
    if parts[2:4] == ["ffn", "experts"] and parts[-2] in ("w1", "w2", "w3"):
        return "expert"
    return None


def build(kw, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = DeepseekV4Config(**kw)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomize(model, cfg, gen)
    return cfg, model, gen


def reference_logits(sd_ref, tmp, tokens, name):
    """Loads the dequantized state dict into transformers and runs full + cached forwards."""
    save_file(sd_ref, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    model = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    return checked_logits(model, tokens, name)


def finish(out, cfg_json, sd_stored, tokens, logits, shards):
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=1)
    write_shards(sd_stored, out, shards)
    save_file({"tokens": tokens[0].to(torch.int64).contiguous(), "logits": logits.contiguous()},
              os.path.join(out, "expected.safetensors"))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"  wrote {out} ({size / 1e6:.2f} MB)")


def make_nvfp4(out_root):
    name = "golden_quant_nvfp4"
    kw = dict(BASE)
    kw.update(num_hidden_layers=4,
              layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                           "compressed_sparse_attention"],
              mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
              compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
              sliding_window=8, index_topk=3,
              rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                               "beta_fast": 32, "beta_slow": 1})
    cfg, model, gen = build(kw, 11)
    out = os.path.join(out_root, name)
    tmp = out + ".hf"
    for d in (out, tmp):
        shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(os.path.join(tmp, "model.safetensors"))
    stored, ref = {}, {}
    for k, v in sd.items():
        kind = is_target(k)
        if kind is None:
            stored[k] = v
            ref[k] = v
            continue
        p = k[: -len(".weight")]
        q, sb, s2, deq = quant_nvfp4(v.float())
        stored[p + ".weight"] = q
        stored[p + ".weight_scale"] = sb
        stored[p + ".weight_scale_2"] = s2.reshape(())
        # Static activation scale: any positive value is valid for weight-only runs;
        # vary it per module so a mixed-up scale would show in --act-quant runs.
        stored[p + ".input_scale"] = torch.tensor(0.002 + 0.003 * torch.rand((), generator=gen).item())
        ref[k] = deq
    tokens = torch.randint(2, cfg.vocab_size, (1, 40), generator=gen)
    logits = reference_logits(ref, tmp, tokens, name)
    cfg_json = json.load(open(os.path.join(tmp, "config.json")))
    cfg_json["quantization_config"] = {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "ignore": ["head", "embed_tokens", "layers.*.attn.compressor*", "layers.*.attn.indexer*", "layers.*.ffn.gate"]}
    finish(out, cfg_json, stored, tokens, logits, 2)
    shutil.rmtree(tmp)


def make_release(out_root):
    name = "golden_quant_release"
    ratios = [0, 4, 128, 0]  # 3 layers + the MTP entry
    rs = {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1}
    kw = dict(BASE)
    kw.update(hidden_size=192, num_hidden_layers=3, sliding_window=32, index_topk=8,
              layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
              mlp_layer_types=["hash_moe", "moe", "moe"],
              compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
              rope_parameters={"rope_type": "yarn", "factor": rs["factor"],
                               "original_max_position_embeddings": rs["original_max_position_embeddings"],
                               "beta_fast": rs["beta_fast"], "beta_slow": rs["beta_slow"]})
    cfg, model, gen = build(kw, 12)
    out = os.path.join(out_root, name)
    tmp = out + ".hf"
    for d in (out, tmp):
        shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(os.path.join(tmp, "model.safetensors"))
    stored, ref = {}, {}
    for k, v in sd.items():
        kind = is_target(k)
        p = k[: -len(".weight")]
        if kind == "expert":
            q, e8, deq = quant_mxfp4(v.float())
            stored[p + ".weight"], stored[p + ".scale"], ref[k] = q, e8, deq
        elif kind is not None:
            q, e8, deq = quant_fp8_block(v.float())
            stored[p + ".weight"], stored[p + ".scale"], ref[k] = q, e8, deq
        elif v.is_floating_point():
            stored[k] = v.to(torch.bfloat16)
            ref[k] = stored[k].float()
        else:
            stored[k] = ref[k] = v
    tokens = torch.randint(2, cfg.vocab_size, (1, 150), generator=gen)
    logits = reference_logits(ref, tmp, tokens, name)
    hf_cfg = json.load(open(os.path.join(tmp, "config.json")))
    cfg_json = release_config(hf_cfg, dict(compress_ratios=ratios, num_hash_layers=1, rope_scaling=rs))
    cfg_json["expert_dtype"] = "fp4"
    cfg_json["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    finish(out, cfg_json, to_release(stored), tokens, logits, 2)
    shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
    ap.add_argument("--only", default=None, choices=[None, "nvfp4", "release"])
    a = ap.parse_args()
    if a.only in (None, "nvfp4"):
        make_nvfp4(a.out)
    if a.only in (None, "release"):
        make_release(a.out)


if __name__ == "__main__":
    main()
