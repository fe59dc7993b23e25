#!/usr/bin/env python3
"""Makes the end-to-end golden fixtures: small random DeepSeek-V4 checkpoints
plus the logits transformers computes for them (spec §15.4).

Every parameter and buffer is randomised (transformers' init leaves sinks,
position biases, mHC base/scale and the router bias at 0/1, which would leave
those paths untested), tid2eid gets distinct experts per token, and the
indexer has >= 16 heads so top-k ties are vanishingly unlikely. For each
config the script also runs the cached token-by-token path and refuses a
fixture whose cached and full logits disagree (a tie at the top-k boundary).

Output per fixture, under tests/data/golden/<name>/:
  config.json, model.safetensors (or shards + index), expected.safetensors
  holding `tokens` (I64 [T]) and `logits` (F32 [T, vocab]).

Run:  python3 tools/make_golden.py [--out tests/data/golden]
(needs torch and transformers >= 5.17 with DeepseekV4ForCausalLM; CPU is fine).
"""
import argparse
import json
import math
import os
import shutil

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

BASE = dict(
    vocab_size=128, hidden_size=64, moe_intermediate_size=32, num_attention_heads=4, head_dim=32,
    partial_rotary_factor=8 / 32, q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=8,
    num_experts_per_tok=2, index_n_heads=16, index_head_dim=16, hc_mult=4, hc_sinkhorn_iters=20,
    routed_scaling_factor=1.5, swiglu_limit=10.0, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1,
)

FIXTURES = {
    # transformers spelling; every attention kind; small ratios so HCA emits entries;
    # YaRN on the compressed layers; the indexer must choose 3 of up to 10 entries.
    "hf_mixed_yarn": dict(
        spelling="transformers", dtype="f32", seq=40, seed=1,
        cfg=dict(num_hidden_layers=4,
                 layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                              "compressed_sparse_attention"],
                 mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                 compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                 sliding_window=8, index_topk=3,
                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                  "beta_fast": 32, "beta_slow": 1})),
    # release key and config spelling, real ratios 4/128 and a sequence past 128,
    # two hash layers, YaRN via rope_scaling, BF16 weights, two shards.
    "release_real_ratios": dict(
        spelling="release", dtype="bf16", seq=150, seed=2, shards=2,
        cfg=dict(num_hidden_layers=4, compress_ratios=[0, 4, 128, 4, 0], num_hash_layers=2,
                 sliding_window=32, index_topk=8, num_nextn_predict_layers=1,
                 rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64,
                               "beta_fast": 32, "beta_slow": 1})),
    # transformers spelling, HCA and window-only layers, plain RoPE, one hash layer.
    "hf_hca_window": dict(
        spelling="transformers", dtype="f32", seq=37, seed=3,
        cfg=dict(num_hidden_layers=3,
                 layer_types=["heavily_compressed_attention", "sliding_attention", "heavily_compressed_attention"],
                 mlp_layer_types=["hash_moe", "moe", "moe"],
                 compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
                 sliding_window=12, index_topk=4)),
    # transformers spelling with the test tokenizer (vocab 4022): the fixture for text commands
    # (tokenize -> model -> perplexity); expected.json also holds the perplexity of TEXT.
    "hf_text": dict(
        spelling="transformers", dtype="bf16", seq=24, seed=4, tokenizer="tokenizer",
        cfg=dict(num_hidden_layers=3,
                 layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
                 mlp_layer_types=["hash_moe", "moe", "moe"],
                 compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                 sliding_window=16, index_topk=4)),
}

# Text for the perplexity fixture (public-domain, Genesis 1:1-5, KJV).
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
        "And God said, Let there be light: and there was light. And God saw the light, that it was good: and "
        "God divided the light from the darkness. And God called the light Day, and the darkness he called "
        "Night. And the evening and the morning were the first day.\n")
PPL_CTX = 32


def perplexity(model, ids, ctx):
    """exp(mean NLL), non-overlapping full windows, tokens 1.. of each (clawmine perplexity's protocol)."""
    n = len(ids) // ctx * ctx
    wins = torch.tensor(ids[:n]).view(-1, ctx)
    with torch.no_grad():
        logits = model(wins, use_cache=False).logits.float()
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), wins[:, 1:].reshape(-1))
    return math.exp(nll.item()), wins.shape[0] * (ctx - 1)


def randomize(model, cfg, gen):
    """Gives every parameter and buffer a random, well-scaled value."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and ("proj" in name or "lm_head" in name or "embed" in name or "gate.weight" in name
                                 or name.endswith(".fn") or "hc_fn" in name):
                std = 1.0 / math.sqrt(p.shape[1]) if not ("embed" in name) else 1.0
                if name.endswith(".fn") or "hc_fn" in name:
                    std = 0.5 / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif p.dim() == 3:  # merged experts [E, out, in]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[2]))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("scale") or "hc_scale" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))
            else:  # sinks, position_bias, base
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(b.shape[0])]))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))


def checked_logits(model, tokens, name):
    """Full-forward logits [T, vocab] (use_cache=False). The cached token-by-token path must agree,
    else the fixture has a top-k tie at the indexer boundary and is refused."""
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits[0].float()
        past, steps = None, []
        for t in range(tokens.shape[1]):
            o = model(tokens[:, t:t + 1], past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits[0, -1].float())
    diff = (full - torch.stack(steps)).abs().max().item()
    print(f"{name}: T={tokens.shape[1]} full-vs-cached max diff {diff:.3e}, logits amax {full.abs().max():.3f}")
    assert diff < 1e-4, f"{name}: cached and full logits disagree ({diff}); change the seed"
    return full


def to_release(sd):
    """transformers-saved keys -> DeepSeek release keys (spec §15.5)."""
    table = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
             "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
             "model.hc_head.hc_scale": "hc_head_scale"}
    out = {}
    for k, v in sd.items():
        if k in table:
            nk = table[k]
        elif k.startswith("model."):
            nk = k[len("model."):]
            if nk.endswith(".attn.norm.weight"):
                nk = nk[: -len(".attn.norm.weight")] + ".attn.kv_norm.weight"
        else:
            nk = k
        out[nk] = v
    return out


def release_config(hf_cfg_dict, spec_cfg):
    """A release-style config.json: compress_ratios (+ MTP entry), num_hash_layers, rope_scaling."""
    c = {k: v for k, v in hf_cfg_dict.items()
         if k not in ("layer_types", "mlp_layer_types", "compress_rates", "rope_parameters", "partial_rotary_factor")}
    c["compress_ratios"] = spec_cfg["compress_ratios"]
    c["num_hash_layers"] = spec_cfg["num_hash_layers"]
    c["rope_scaling"] = spec_cfg["rope_scaling"]
    c["rope_theta"] = 10000.0
    c["compress_rope_theta"] = 160000.0
    c["qk_rope_head_dim"] = int(BASE["head_dim"] * BASE["partial_rotary_factor"])
    c["num_nextn_predict_layers"] = spec_cfg.get("num_nextn_predict_layers", 1)
    return c


def write_shards(sd, out_dir, shards):
    keys = sorted(sd)
    per = math.ceil(len(keys) / shards)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k].contiguous() for k in keys[i * per:(i + 1) * per]}
        save_file(part, os.path.join(out_dir, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def make(name, spec, out_root):
    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    kw = dict(BASE)
    cfg_spec = dict(spec["cfg"])
    tok_dir = None
    if spec.get("tokenizer"):
        tok_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", spec["tokenizer"])
        from tokenizers import Tokenizer
        hf_tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        kw["vocab_size"] = hf_tok.get_vocab_size()
    if spec["spelling"] == "release":
        ratios = cfg_spec.pop("compress_ratios")
        nh = cfg_spec.pop("num_hash_layers")
        rs = cfg_spec.pop("rope_scaling")
        cfg_spec.pop("num_nextn_predict_layers", None)
        kw.update(cfg_spec)
        kw["layer_types"] = [{0: "sliding_attention", 4: "compressed_sparse_attention",
                              128: "heavily_compressed_attention"}[r] for r in ratios[:kw["num_hidden_layers"]]]
        kw["mlp_layer_types"] = ["hash_moe"] * nh + ["moe"] * (kw["num_hidden_layers"] - nh)
        kw["compress_rates"] = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
        kw["rope_parameters"] = {"rope_type": "yarn", "factor": rs["factor"],
                                 "original_max_position_embeddings": rs["original_max_position_embeddings"],
                                 "beta_fast": rs["beta_fast"], "beta_slow": rs["beta_slow"]}
        release_spec = dict(compress_ratios=ratios, num_hash_layers=nh, rope_scaling=rs)
    else:
        kw.update(cfg_spec)
    cfg = DeepseekV4Config(**kw)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomize(model, cfg, gen)

    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    tmp = out + ".hf"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(os.path.join(tmp, "model.safetensors"))
    if spec["dtype"] == "bf16":
        sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in sd.items()}
        save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    # The reference model reads back exactly what is stored (bf16 values up-cast to fp32).
    model = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()

    tokens = torch.randint(2, cfg.vocab_size, (1, spec["seq"]), generator=gen)
    full = checked_logits(model, tokens, name)

    os.makedirs(out)
    hf_cfg = json.load(open(os.path.join(tmp, "config.json")))
    if spec["spelling"] == "release":
        sd = to_release(sd)
        cfg_json = release_config(hf_cfg, release_spec)
    else:
        cfg_json = hf_cfg
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=1)
    if spec.get("shards", 1) > 1:
        write_shards(sd, out, spec["shards"])
    else:
        save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file({"tokens": tokens[0].to(torch.int64).contiguous(), "logits": full.contiguous()},
              os.path.join(out, "expected.safetensors"))
    if tok_dir:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, f), out)
        ids = hf_tok.encode(TEXT, add_special_tokens=False).ids
        ppl, scored = perplexity(model, ids, PPL_CTX)
        with open(os.path.join(out, "text.txt"), "w") as f:
            f.write(TEXT)
        with open(os.path.join(out, "expected.json"), "w") as f:
            json.dump({"perplexity": ppl, "ctx": PPL_CTX, "tokens_scored": scored, "text_ids": ids}, f)
        print(f"{name}: perplexity {ppl:.4f} over {scored} tokens")
    shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden"))
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, spec in FIXTURES.items():
        if a.only and name != a.only:
            continue
        make(name, spec, a.out)


if __name__ == "__main__":
    main()
