#!/usr/bin/env python3
"""Trains an MTP block (DeepSeek-V4's next-token-prediction layer, `mtp.0.*`) for clawmine's embedded
default model, with the main model frozen: the default model's weights, its tokenizer and its held-out
perplexity stay exactly as they are; only the draft layer is new.

  X_in[t, k] = e_proj(enorm(embed[token t+1])) + h_proj(hnorm(X[t, k]))   X: the last layer's 4 streams
  X_out      = Block(X_in)            a sliding-window, score-routed V4 layer
  logits     = head(norm(HCHead_mtp(X_out)))                              predicts token t+2

(embed and head are the main model's.) The frozen main model is the NVFP4 checkpoint expanded to BF16
(E2M1 x E4M3 x the tensor scale: the values clawmine computes with), loaded by transformers. The block
starts as a copy of layer 0 (attention, experts, mHC; its router's weight; zero routing bias), the HC
head and norm as copies of the model's, h_proj = identity, e_proj small; AdamW on random 1024-token
windows of the training split until the held-out MTP loss stops improving (or --minutes runs out).

Inputs (made on a machine with the corpus, see tools/train_tiny.py): the training and held-out splits
as uint16 token ids of the default tokenizer (--train-ids, --test-ids). Output in --out:
model-mtp.safetensors (BF16, checkpoint spelling `model.mtp.0.*`), mtp_index.json (its weight_map
entries) and training_mtp.json (the curve, the held-out top-1 agreement of the block's prediction with
the main model's next prediction = the greedy acceptance of one draft).

Run on the GPU machine (torch + transformers >= 5.17):
  python3 tools/train_mtp_head.py --model models/default --train-ids T.bin --test-ids H.bin --out $OUT/mtp
"""
import argparse
import copy
import json
import math
import os
import shutil
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

CTX = 1024
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def expand_nvfp4(packed, scale, scale_2):
    """ModelOpt NVFP4 -> float32: element 2j in the low nibble, one E4M3 scale per 16, a tensor scale."""
    lut = torch.tensor(E2M1)
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    s = scale.float().repeat_interleave(16, dim=1)
    return lut[codes] * s * scale_2.float()


def bf16_copy_of(model_dir, out_dir):
    """The checkpoint with every NVFP4 linear expanded to BF16 and no quantization_config."""
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(model_dir):
        if name.endswith(".json") and name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(os.path.join(model_dir, name), out_dir)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    cfg.pop("quantization_config", None)
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"))
    ts = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            ts.update(load_file(os.path.join(model_dir, name)))
    out = {}
    for k, v in ts.items():
        if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        p = k[: -len(".weight")] if k.endswith(".weight") else None
        if p is not None and p + ".weight_scale" in ts:
            out[k] = expand_nvfp4(v, ts[p + ".weight_scale"], ts[p + ".weight_scale_2"]).to(torch.bfloat16)
        else:
            out[k] = v.contiguous()
    save_file(out, os.path.join(out_dir, "model.safetensors"))


class Mtp(nn.Module):
    """The MTP block around a one-layer V4 model (its layer 0 = the block, its hc_head and norm)."""

    def __init__(self, main):
        super().__init__()
        from transformers import DeepseekV4ForCausalLM
        cfg = copy.deepcopy(main.config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["sliding_attention"]
        cfg.mlp_layer_types = ["moe"]
        self.one = DeepseekV4ForCausalLM(cfg)
        D, eps = cfg.hidden_size, cfg.rms_norm_eps
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RMSNorm
        self.enorm, self.hnorm = DeepseekV4RMSNorm(D, eps=eps), DeepseekV4RMSNorm(D, eps=eps)
        self.e_proj, self.h_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        with torch.no_grad():
            nn.init.normal_(self.e_proj.weight, std=0.02)
            self.h_proj.weight.copy_(torch.eye(D))
            self.enorm.weight.fill_(1.0), self.hnorm.weight.fill_(1.0)
            src = main.model.layers[0].state_dict()
            dst = self.one.model.layers[0].state_dict()
            for k in dst:
                if k in src and src[k].shape == dst[k].shape and "e_score_correction_bias" not in k:
                    dst[k].copy_(src[k])
            self.one.model.hc_head.load_state_dict(main.model.hc_head.state_dict())
            self.one.model.norm.load_state_dict(main.model.norm.state_dict())
        del self.one.model.embed_tokens, self.one.lm_head  # the main model's are used

    def forward(self, main, x_next, streams, kw):
        e = self.e_proj(self.enorm(main.model.embed_tokens(x_next)))
        h = self.h_proj(self.hnorm(streams)) + e.unsqueeze(2)
        out = self.one.model.layers[0](h, **kw)
        return main.lm_head(self.one.model.norm(self.one.model.hc_head(out)))

    def checkpoint_tensors(self):
        """model.mtp.0.* in checkpoint spelling (transformers writes the one-layer model's keys)."""
        with tempfile.TemporaryDirectory() as d:
            one = copy.deepcopy(self.one)
            one.model.embed_tokens = nn.Embedding(one.config.vocab_size, one.config.hidden_size)
            one.lm_head = nn.Linear(one.config.hidden_size, one.config.vocab_size, bias=False)
            one.to(torch.bfloat16).save_pretrained(d)
            ts = {}
            for n in os.listdir(d):
                if n.endswith(".safetensors"):
                    ts.update(load_file(os.path.join(d, n)))
        out = {}
        for k, v in ts.items():
            if k.startswith("model.layers.0."):
                out["model.mtp.0." + k[len("model.layers.0."):]] = v
        out["model.mtp.0.norm.weight"] = ts["model.norm.weight"]
        for n in ("fn", "base", "scale"):
            out[f"model.mtp.0.hc_head_{n}"] = ts[f"model.hc_head.hc_{n}"]
        out["model.mtp.0.e_proj.weight"] = self.e_proj.weight.detach().to(torch.bfloat16).cpu()
        out["model.mtp.0.h_proj.weight"] = self.h_proj.weight.detach().to(torch.bfloat16).cpu()
        out["model.mtp.0.enorm.weight"] = self.enorm.weight.detach().to(torch.bfloat16).cpu()
        out["model.mtp.0.hnorm.weight"] = self.hnorm.weight.detach().to(torch.bfloat16).cpu()
        return {k: v.contiguous() for k, v in out.items()}


def main_forward(main, x, grab):
    """The frozen model on x: its logits, and (via hooks) its last streams and the layer kwargs."""
    with torch.no_grad():
        logits = main(x, use_cache=False).logits
    return logits, grab["streams"], grab["kw"]


def evaluate(main, mtp, ids, device, grab, windows=48):
    mtp.eval()
    n = min(len(ids) // CTX, windows)
    tot, cnt, agree, main_tot, main_cnt = 0.0, 0, 0, 0.0, 0
    with torch.no_grad():
        for i in range(0, n, 8):
            x = torch.stack([ids[j * CTX:(j + 1) * CTX] for j in range(i, min(n, i + 8))]).to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
                logits, streams, kw = main_forward(main, x, grab)
                x_next = torch.cat([x[:, 1:], x[:, -1:]], dim=1)
                ml = mtp(main, x_next, streams, kw).float()
            tot += F.cross_entropy(ml[:, :-2].reshape(-1, ml.shape[-1]), x[:, 2:].reshape(-1), reduction="sum").item()
            cnt += x[:, 2:].numel()
            agree += (ml[:, :-2].argmax(-1) == logits[:, 1:-1].float().argmax(-1)).sum().item()
            lf = logits.float()
            main_tot += F.cross_entropy(lf[:, :-1].reshape(-1, lf.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
            main_cnt += x[:, 1:].numel()
    mtp.train()
    evaluate.main_ppl = math.exp(main_tot / main_cnt)  # the frozen model's (a check of the expansion)
    return tot / cnt, agree / cnt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--train-ids", required=True)
    ap.add_argument("--test-ids", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--eval-windows", type=int, default=48, help="held-out windows per evaluation")
    ap.add_argument("--smoke", action="store_true", help="a few steps on short windows (CPU)")
    a = ap.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    global CTX
    if a.smoke:
        CTX = 128
    load = lambda p: torch.frombuffer(bytearray(open(p, "rb").read()), dtype=torch.int16).long() & 0xFFFF
    train_ids, test_ids = load(a.train_ids), load(a.test_ids)
    os.makedirs(a.out, exist_ok=True)
    from transformers import DeepseekV4ForCausalLM
    with tempfile.TemporaryDirectory() as d:
        bf16_copy_of(a.model, d)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32  # CPU (--smoke): no autocast
        main_model = DeepseekV4ForCausalLM.from_pretrained(d, dtype=dtype).to(device).eval()
    for p in main_model.parameters():
        p.requires_grad_(False)
    grab = {}
    main_model.model.hc_head.register_forward_hook(lambda m, inp, out: grab.__setitem__("streams", inp[0]))

    def pre(m, args, kwargs):
        grab["kw"] = {k: kwargs[k] for k in ("position_embeddings", "position_ids", "attention_mask")}
    main_model.model.layers[-1].register_forward_pre_hook(pre, with_kwargs=True)
    mtp = Mtp(main_model).to(device).train()
    params = [p for p in mtp.parameters() if p.requires_grad]
    print(f"main model loaded ({time.time()-t0:.0f} s); MTP block {sum(p.numel() for p in params)/1e6:.2f}M "
          f"parameters", flush=True)
    loss0, agree0 = evaluate(main_model, mtp, test_ids, device, grab, 4 if a.smoke else a.eval_windows)
    print(f"start: held-out MTP loss {loss0:.4f}, top-1 agreement {agree0:.3f}; the main model's held-out "
          f"perplexity {evaluate.main_ppl:.3f}", flush=True)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget, warm = a.minutes * 60, 50
    best, best_state, bad, step, curve = float("inf"), None, 0, 0, [(0, None, loss0, agree0)]
    batch = 2 if a.smoke else a.batch
    while step < a.max_steps:
        frac = min(1.0, (time.time() - t0) / budget)
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - CTX - 1, (batch,))
        x = torch.stack([train_ids[s:s + CTX] for s in starts]).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            _, streams, kw = main_forward(main_model, x, grab)
            ml = mtp(main_model, torch.cat([x[:, 1:], x[:, -1:]], dim=1), streams, kw)
            loss = F.cross_entropy(ml[:, :-2].float().reshape(-1, ml.shape[-1]), x[:, 2:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % (5 if a.smoke else a.eval_every) == 0 or time.time() - t0 > budget:
            hl, ag = evaluate(main_model, mtp, test_ids, device, grab, 4 if a.smoke else a.eval_windows)
            curve.append((step, loss.item(), hl, ag))
            print(f"step {step:5d} {time.time()-t0:5.0f}s lr {lr:.2e} train {loss.item():.4f} held-out {hl:.4f} "
                  f"top-1 agreement {ag:.3f}", flush=True)
            if hl < best:
                best, bad = hl, 0
                best_state = {k: v.detach().clone() for k, v in mtp.state_dict().items()}
            else:
                bad += 1
            if bad >= a.patience or time.time() - t0 > budget or (a.smoke and step >= 10):
                break
    mtp.load_state_dict(best_state)
    hl, ag = evaluate(main_model, mtp, test_ids, device, grab, 4 if a.smoke else 10 ** 6)
    ts = mtp.checkpoint_tensors()
    save_file(ts, os.path.join(a.out, "model-mtp.safetensors"))
    json.dump({k: "model-mtp.safetensors" for k in ts}, open(os.path.join(a.out, "mtp_index.json"), "w"), indent=1)
    res = {"steps": step, "best_heldout_mtp_loss": best, "heldout_mtp_loss": hl, "heldout_top1_agreement": ag,
           "start": {"loss": loss0, "agreement": agree0}, "main_heldout_ppl": evaluate.main_ppl, "curve": curve, "minutes": (time.time() - t0) / 60,
           "tensors": len(ts)}
    json.dump(res, open(os.path.join(a.out, "training_mtp.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "curve"}), flush=True)


if __name__ == "__main__":
    main()
