#!/usr/bin/env python3
"""Writes models/v4-flash and models/v4-pro: the released config.json of DeepSeek-V4-Flash and -Pro
(release spelling) with a byte-level tokenizer of the full 129,280-token vocabulary, for
`--load-format dummy` (weights generated on the device, nothing downloaded).

The tokenizer keeps V4's special tokens at their real ids (BOS 0, EOS 1, pad 2, <｜User｜> 128803,
<｜Assistant｜> 128804, <think> 128821, </think> 128822, the DSML and task tokens) and V4's
pre-tokenizer; its BPE has the 256 byte tokens and no merges, so text encodes to one token per byte
(a prompt of N bytes is N tokens), and every other id decodes to a fixed one- to three-byte string,
so random ids from dummy weights always decode. Usage: tools/make_dummy_models.py [models-dir]
"""
import json
import os
import sys

SPECIAL = {0: "<｜begin▁of▁sentence｜>", 1: "<｜end▁of▁sentence｜>", 2: "<｜▁pad▁｜>",
           128803: "<｜User｜>", 128804: "<｜Assistant｜>", 128821: "<think>", 128822: "</think>",
           128823: "<｜DSML｜tool_calls>", 128824: "</｜DSML｜tool_calls>", 128825: "｜DSML｜",
           128828: "<｜latest_reminder｜>", 128829: "<｜action｜>", 128830: "<｜query｜>",
           128831: "<｜authority｜>", 128832: "<｜domain｜>", 128836: "<｜title｜>", 128845: "<｜read_url｜>"}
VOCAB = 129280


def byte_chars():
    """GPT-2's byte -> printable unicode map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def tokenizer():
    chars = byte_chars()
    vocab = {}
    fill = (a + b for a in chars for b in chars)  # 2-byte strings, then 3-byte ones
    fill3 = (a + b + c for a in chars for b in chars for c in chars)
    nxt = 3
    for ch in chars:  # the byte tokens first: ids 3..258
        vocab[ch] = nxt
        nxt += 1
    for i in range(VOCAB):
        if i in SPECIAL or i < nxt:
            continue
        s = next(fill, None) or next(fill3)
        vocab[s] = i
    for i, s in SPECIAL.items():
        vocab[s] = i
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, s in sorted(SPECIAL.items())]
    src = json.load(open(os.path.join(os.path.dirname(__file__), "..", "models", "default", "tokenizer.json")))
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": src["pre_tokenizer"], "post_processor": None, "decoder": src["decoder"],
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": []}}


def config(pro):
    ratios = ([128, 128] + [4, 128] * 29 + [4] + [0]) if pro else ([0, 0] + [4, 128] * 20 + [4] + [0])
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": VOCAB, "hidden_size": 7168 if pro else 4096, "num_hidden_layers": 61 if pro else 43,
        "num_attention_heads": 128 if pro else 64, "num_key_value_heads": 1, "head_dim": 512,
        "qk_rope_head_dim": 64, "q_lora_rank": 1536 if pro else 1024, "o_groups": 16 if pro else 8,
        "o_lora_rank": 1024, "n_routed_experts": 384 if pro else 256, "num_experts_per_tok": 6,
        "n_shared_experts": 1, "moe_intermediate_size": 3072 if pro else 2048, "scoring_func": "sqrtsoftplus",
        "routed_scaling_factor": 2.5 if pro else 1.5, "norm_topk_prob": True, "topk_method": "noaux_tc",
        "num_hash_layers": 3, "swiglu_limit": 10.0, "sliding_window": 128, "compress_ratios": ratios,
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 1024 if pro else 512,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "expert_dtype": "fp4",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    }


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "models")
    tok = tokenizer()
    tok_cfg = {"bos_token": SPECIAL[0], "eos_token": SPECIAL[1], "pad_token": SPECIAL[2], "add_bos_token": False,
               "add_eos_token": False, "model_max_length": 1048576, "tokenizer_class": "PreTrainedTokenizerFast"}
    for name, pro in (("v4-flash", False), ("v4-pro", True)):
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config(pro), f, indent=2)
            f.write("\n")
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tok_cfg, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
