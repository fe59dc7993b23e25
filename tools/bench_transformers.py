#!/usr/bin/env python3
"""transformers' DeepSeek-V4 on the GPU, in the configuration of `clawmine bench model`.

Builds DeepseekV4ForCausalLM with V4-Flash's released configuration (hidden 4096,
64 heads x 512, q_lora 1024, o_lora 1024 in 8 groups, 256 experts top-6 plus a
shared expert of 2048, indexer 64 x 128 top-512, window 128, Flash's layer
pattern [SWA, SWA, CSA, HCA, CSA, ...] with its first 3 layers hash-routed, YaRN
on the compressed layers) truncated to --layers layers, random init, BF16,
eager attention and eager experts, on one GPU. In BF16 one layer's routed
experts alone are 12.9 GB, so only a few layers fit; every number is also given
per layer so it compares with clawmine's us per layer.

Measures, with torch.cuda.Event (warmup first, median of --repeats):
  - prefill: one sequence of P random tokens in one forward (use_cache=True);
    tokens/s and ms per layer;
  - decode: B sequences, each first prefilled with --decode-context tokens, then
    one token per sequence per forward with the cache; ms per step (= per token
    of each sequence) and ms per layer.
A point that runs out of memory is reported as such and skipped.

Run (on the device, after pip has torch and transformers):
  python3 tools/bench_transformers.py --layers 4 --json-file out.json
Smoke test on a CPU:  python3 tools/bench_transformers.py --tiny --device cpu
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch


def flash_layer_types(n):
    ratios = [0, 0] + [4, 128] * 20 + [4]
    names = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    if n > len(ratios):
        raise SystemExit(f"--layers {n}: V4-Flash has {len(ratios)} layers")
    return [names[r] for r in ratios[:n]]


def make_config(args):
    from transformers import DeepseekV4Config

    n = args.layers
    kw = dict(
        vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=n,
        num_attention_heads=64, num_key_value_heads=1, head_dim=512, partial_rotary_factor=64 / 512,
        q_lora_rank=1024, o_groups=8, o_lora_rank=1024, n_routed_experts=256, num_experts_per_tok=6,
        n_shared_experts=1, routed_scaling_factor=1.5, swiglu_limit=10.0, sliding_window=128,
        index_n_heads=64, index_head_dim=128, index_topk=512, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        rms_norm_eps=1e-6, max_position_embeddings=1048576, rope_theta=10000.0, compress_rope_theta=160000.0,
        layer_types=flash_layer_types(n), mlp_layer_types=["hash_moe"] * min(n, 3) + ["moe"] * max(0, n - 3),
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        num_nextn_predict_layers=1, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    if args.tiny:  # the same structure, small (a CPU smoke test of this script)
        kw.update(vocab_size=512, hidden_size=256, moe_intermediate_size=128, num_attention_heads=4, head_dim=128,
                  partial_rotary_factor=64 / 128, q_lora_rank=128, o_groups=2, o_lora_rank=128, n_routed_experts=8,
                  num_experts_per_tok=2, index_n_heads=4, index_head_dim=64, index_topk=8, sliding_window=16,
                  compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                  max_position_embeddings=65536,
                  rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096,
                                   "beta_fast": 32, "beta_slow": 1})
    return DeepseekV4Config(**kw)


def build_model(cfg, args):
    from transformers import DeepseekV4ForCausalLM

    kwargs = {"attn_implementation": "eager"}
    if args.experts_implementation:
        kwargs["experts_implementation"] = args.experts_implementation
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(args.device):
            try:
                model = DeepseekV4ForCausalLM._from_config(cfg, **kwargs)
            except (TypeError, ValueError) as e:  # an older transformers without one of the kwargs
                print(f"note: _from_config({kwargs}) failed ({e}); using the defaults", file=sys.stderr)
                cfg._attn_implementation = "eager"
                model = DeepseekV4ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = model.to(device=args.device, dtype=torch.bfloat16).eval()  # in case the device context was not honoured
    # Small random weights (the init's scale does not matter for speed; finite activations do).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype.is_floating_point and p.dim() >= 2 and "hc" not in name:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return model


class Timer:
    """Milliseconds of the GPU work between start() and stop() (torch.cuda.Event), or wall time on a CPU."""

    def __init__(self, device):
        self.cuda = device.startswith("cuda")

    def start(self):
        if self.cuda:
            self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.e0.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            self.e1.record()
            torch.cuda.synchronize()
            return self.e0.elapsed_time(self.e1)
        return (time.perf_counter() - self.t0) * 1e3


OOM_TYPES = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
                  if t is not None)


def is_oom(e):
    return isinstance(e, OOM_TYPES) or "out of memory" in str(e).lower()


def free_memory(device):
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def bench_prefill(model, cfg, args, P, timer):
    gen = torch.Generator().manual_seed(P)
    times = []
    for r in range(args.warmup + args.repeats):
        ids = torch.randint(2, cfg.vocab_size, (1, P), generator=gen).to(args.device)
        with torch.no_grad():
            timer.start()
            out = model(ids, use_cache=True, logits_to_keep=1)
            ms = timer.stop()
        del out
        if r >= args.warmup:
            times.append(ms)
    ms = statistics.median(times)
    return {"tokens": P, "ms": ms, "tok_s": P / (ms * 1e-3), "ms_per_layer": ms / cfg.num_hidden_layers,
            "runs_ms": times}


def bench_decode(model, cfg, args, B, timer):
    gen = torch.Generator().manual_seed(1000 + B)
    ids = torch.randint(2, cfg.vocab_size, (B, args.decode_context), generator=gen).to(args.device)
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        del out
        times = []
        for r in range(args.warmup + args.decode_steps):
            timer.start()
            out = model(nxt, past_key_values=past, use_cache=True)
            ms = timer.stop()
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            del out
            if r >= args.warmup:
                times.append(ms)
    ms = statistics.median(times)
    return {"batch": B, "context": args.decode_context, "ms_per_step": ms, "tok_s": B / (ms * 1e-3),
            "ms_per_layer": ms / cfg.num_hidden_layers, "us_per_layer": 1e3 * ms / cfg.num_hidden_layers,
            "runs_ms": times}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="Flash's first layers (4 = SWA, SWA, CSA, HCA; 51 GiB in BF16)")
    ap.add_argument("--prefill", default="2048,8192", help="prompt lengths (comma-separated)")
    ap.add_argument("--batches", default="1,8", help="decode batch sizes (comma-separated)")
    ap.add_argument("--decode-context", type=int, default=4096, help="tokens each sequence holds before decode")
    ap.add_argument("--decode-steps", type=int, default=8, help="timed decode steps per batch (median)")
    ap.add_argument("--repeats", type=int, default=3, help="timed prefill runs per length (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--experts-implementation", default="eager",
                    help="transformers' experts_implementation ('' = the library default)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small dimensions (smoke test)")
    ap.add_argument("--json-file")
    args = ap.parse_args()

    import transformers

    res = {"engine": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
           "dtype": "bfloat16", "attention": "eager", "experts_implementation": args.experts_implementation or "default",
           "layers": args.layers, "device": args.device, "prefill": [], "decode": [], "skipped": [],
           "notes": {"prefill": "one sequence, one forward over the whole prompt (use_cache=True, logits of the last "
                                "row); median of --repeats after --warmup; ms_per_layer = ms / layers",
                     "decode": "B sequences prefilled to decode_context, then one token each per forward with the "
                               "cache; ms_per_step = the time per token of each sequence; median of --decode-steps",
                     "timing": "torch.cuda.Event around each forward (GPU time incl. host launch gaps)"}}
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("bench_transformers: no CUDA device (torch.cuda.is_available() is False)")
        res["gpu"] = torch.cuda.get_device_name(0)

    def save():
        if args.json_file:
            with open(args.json_file, "w") as f:
                json.dump(res, f, indent=2)

    cfg = make_config(args)
    t0 = time.perf_counter()
    try:
        model = build_model(cfg, args)
    except Exception as e:  # noqa: BLE001 - report any failure to build (OOM above all) and stop
        res["skipped"].append(f"model build: {'out of memory' if is_oom(e) else type(e).__name__}: {e}")
        save()
        print(f"bench_transformers: could not build the model: {e}", file=sys.stderr)
        return 1
    res["build_seconds"] = time.perf_counter() - t0
    res["parameters"] = sum(p.numel() for p in model.parameters())
    if args.device.startswith("cuda"):
        res["gpu_memory_gib_after_build"] = torch.cuda.memory_allocated() / 2**30
    print(f"built {args.layers} layers ({res['parameters'] / 1e9:.2f} B parameters) in {res['build_seconds']:.1f} s",
          file=sys.stderr)
    timer = Timer(args.device)
    save()
    def point(what, fn, into, describe):
        """One measurement; out of memory is reported and skipped, anything else stops the run."""
        try:
            r = fn()
            res[into].append(r)
            print(f"{what}: {describe(r)}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001
            if not is_oom(e):
                raise
            res["skipped"].append(f"{what}: out of memory ({str(e).splitlines()[0]})")
            print(f"{what}: out of memory, skipped", file=sys.stderr)
        free_memory(args.device)
        save()

    for P in [int(x) for x in args.prefill.split(",") if x]:
        point(f"prefill {P}", lambda: bench_prefill(model, cfg, args, P, timer), "prefill",
              lambda r: f"{r['ms']:.1f} ms, {r['tok_s']:.0f} tok/s, {r['ms_per_layer']:.2f} ms/layer")
    for B in [int(x) for x in args.batches.split(",") if x]:
        point(f"decode batch {B} context {args.decode_context}", lambda: bench_decode(model, cfg, args, B, timer),
              "decode", lambda r: f"{r['ms_per_step']:.2f} ms/step, {r['us_per_layer']:.0f} us/layer")

    print(f"transformers {res['transformers']} ({res['dtype']}, eager), {args.layers} layers, {res.get('gpu', args.device)}")
    print("| prefill tokens | ms | tok/s | ms per layer |\n|---:|---:|---:|---:|")
    for r in res["prefill"]:
        print(f"| {r['tokens']} | {r['ms']:.1f} | {r['tok_s']:.0f} | {r['ms_per_layer']:.2f} |")
    print(f"| decode batch (context {args.decode_context}) | ms per step | tok/s | us per layer |\n|---:|---:|---:|---:|")
    for r in res["decode"]:
        print(f"| {r['batch']} | {r['ms_per_step']:.2f} | {r['tok_s']:.1f} | {r['us_per_layer']:.0f} |")
    for s in res["skipped"]:
        print(f"skipped: {s}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
