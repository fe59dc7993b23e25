#!/usr/bin/env python3
"""Trains clawmine's embedded default model: a small DeepSeek-V4 (~25M parameters)
on the King James Bible (public domain, Debian package bible-kjv).

Keeps every architectural feature: window-only, CSA (ratio 4, lightning
indexer) and HCA (ratio 128) layers with a 128-token sliding window, hash-routed
first layers, 16 routed experts + a shared expert, mHC with 4 streams,
attention sinks, YaRN on the compressed layers, context 1024.

Steps:
  1. byte-level BPE tokenizer (DeepSeek-V3/V4 pre-tokenizer, DeepSeek's special
     tokens, vocab 4096) trained on the training split with `tokenizers`;
  2. hold out every 20th block of 50 lines as the test split;
  3. train with AdamW in bf16 autocast on random 1024-token windows until the
     held-out loss stops improving (or --minutes runs out); print the curve;
  4. save the best weights as a BF16 checkpoint (shards <= 14 MB) with
     tokenizer.json / tokenizer_config.json, and report the held-out
     perplexity of the saved BF16 weights with the protocol
     `clawmine perplexity --ctx 1024` uses (non-overlapping windows, every
     token after the first of a window scored).

Run on the GPU machine (torch + transformers >= 5.17):
  python3 tools/train_tiny.py --corpus .train/kjv.txt --out $OUT/tiny --minutes 8
The corpus: apt-get install bible-kjv; bible -f "Gen1:1-Rev22:21" > .train/kjv.txt
"""
import argparse
import json
import math
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixtures import BOS, DS_SPLITS, EOS, PAD, SPECIALS  # noqa: E402

CTX = 1024


def read_corpus(path):
    """KJV text without the verse references ("Ge1:1 "), one verse per line."""
    lines = []
    for line in open(path, encoding="utf-8"):
        line = re.sub(r"^\S+\d+:\d+\s+", "", line.rstrip("\n"))
        if line.strip():
            lines.append(line)
    blocks = [lines[i:i + 50] for i in range(0, len(lines), 50)]
    train = [l for i, b in enumerate(blocks) if i % 20 != 19 for l in b]
    test = [l for i, b in enumerate(blocks) if i % 20 == 19 for l in b]
    return "\n".join(train) + "\n", "\n".join(test) + "\n"


def train_tokenizer(text, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DS_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(SPECIALS), min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 100000] for i in range(0, len(text), 100000)], trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    return tok


def model_config(vocab):
    from transformers import DeepseekV4Config
    return DeepseekV4Config(
        vocab_size=vocab, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, head_dim=128,
        qk_rope_head_dim=32, q_lora_rank=128, o_groups=2, o_lora_rank=128,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        sliding_window=128, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
        moe_intermediate_size=256, routed_scaling_factor=1.5, swiglu_limit=10.0,
        index_n_heads=8, index_head_dim=64, index_topk=64, hc_mult=4, hc_sinkhorn_iters=20,
        rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256,
                         "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        output_router_logits=True, router_aux_loss_coef=0.01)


def perplexity(model, ids, device, ctx=CTX, batch=8):
    """exp(mean NLL) over non-overlapping ctx windows, tokens 1.. of each scored."""
    model.eval()
    n = len(ids) // ctx * ctx
    wins = ids[: n].view(-1, ctx) if n else ids[None, :]
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, wins.shape[0], batch):
            x = wins[i:i + batch].to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
                logits = model(x, use_cache=False).logits.float()
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
            tot += nll.item()
            cnt += x[:, 1:].numel()
    model.train()
    return math.exp(tot / cnt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--smoke", action="store_true", help="tiny run to check the script (CPU)")
    a = ap.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t_start = time.time()

    train_text, test_text = read_corpus(a.corpus)
    if a.smoke:
        train_text, test_text = train_text[:200000], test_text[:20000]
    tok = train_tokenizer(train_text, a.vocab)
    vocab = tok.get_vocab_size()
    train_ids = torch.tensor(tok.encode(train_text).ids, dtype=torch.long)
    test_ids = torch.tensor(tok.encode(test_text).ids, dtype=torch.long)
    print(f"corpus: train {len(train_text)/1e6:.2f} MB -> {len(train_ids)} tokens, "
          f"test {len(test_text)/1e6:.2f} MB -> {len(test_ids)} tokens, vocab {vocab}", flush=True)

    from transformers import DeepseekV4ForCausalLM
    cfg = model_config(vocab)
    model = DeepseekV4ForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # hash routing: a fixed random table with distinct experts per token
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:cfg.num_experts_per_tok]
                                     for _ in range(b.shape[0])]))
    model.to(device).train()
    nparams = sum(p.numel() for p in model.parameters())
    print(f"model: {nparams/1e6:.2f}M parameters, layers {cfg.layer_types}", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget = a.minutes * 60
    warm = 100
    best, best_state, bad, step = float("inf"), None, 0, 0
    curve = []
    batch = 2 if a.smoke else a.batch
    ctx = 256 if a.smoke else CTX
    while step < a.max_steps:
        frac = min(1.0, (time.time() - t_start) / budget)
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = torch.randint(0, len(train_ids) - ctx - 1, (batch,))
        x = torch.stack([train_ids[s:s + ctx] for s in starts]).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            out = model(x, labels=x, use_cache=False)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % (5 if a.smoke else a.eval_every) == 0 or time.time() - t_start > budget:
            ppl = perplexity(model, test_ids[: 4 * ctx + 1] if a.smoke else test_ids, device, ctx=ctx)
            curve.append((step, out.loss.item(), math.log(ppl)))
            print(f"step {step:6d}  {time.time()-t_start:6.0f}s  lr {lr:.2e}  train loss {out.loss.item():.4f}  "
                  f"held-out loss {math.log(ppl):.4f}  ppl {ppl:.2f}", flush=True)
            if ppl < best:
                best, bad = ppl, 0
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            else:
                bad += 1
            if bad >= a.patience or time.time() - t_start > budget or (a.smoke and step >= 10):
                break
    model.load_state_dict(best_state)

    os.makedirs(a.out, exist_ok=True)
    model.config.output_router_logits = False
    model.to(torch.bfloat16).save_pretrained(a.out, max_shard_size="14MB")
    tok.save(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "add_bos_token": False,
                   "add_eos_token": False, "model_max_length": CTX,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    with open(os.path.join(a.out, "heldout.txt"), "w") as f:
        f.write(test_text)
    # Held-out perplexity of exactly what was saved (BF16 weights, fp32 math).
    saved = DeepseekV4ForCausalLM.from_pretrained(a.out, dtype=torch.float32).to(device)
    ppl_bf16 = perplexity(saved, test_ids, "cpu" if device == "cpu" else device, ctx=ctx)
    result = {"params": nparams, "steps": step, "best_heldout_ppl_training": best,
              "heldout_ppl_bf16_checkpoint": ppl_bf16, "heldout_tokens": len(test_ids), "ctx": ctx,
              "curve": curve, "minutes": (time.time() - t_start) / 60}
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)


if __name__ == "__main__":
    main()
