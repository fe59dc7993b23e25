// DeepSeek-V4 weights: plain data. Linear layers are LinearWeight (stored
// format, usually views into the mmap'd checkpoint); small parameters (norms,
// mHC, sinks, biases, position biases) are expanded to fp32 vectors at load.
// Shapes use D = hidden, H = heads, hd = head_dim, E = routed experts,
// I = moe_intermediate, hc = hc_mult, m = compression ratio, ihd/inh =
// indexer head dim/heads, G = o_groups, ol = o_lora_rank, ql = q_lora_rank.
// Names in comments are the release spelling (spec §10); the loader maps them
// to the transformers spelling with one explicit table (weights.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "ops/linear.h"
#include "quant/load_linear.h"

namespace cm {

struct HcWeights {
  std::vector<float> fn;     // hc_*_fn     [(2+hc)·hc, hc·D]
  std::vector<float> base;   // hc_*_base   [(2+hc)·hc]
  std::vector<float> scale;  // hc_*_scale  [3]
};

struct CompressorWeights {
  LinearWeight wkv;          // compressor.wkv    [c·dc, D]   (c = 2 for CSA, 1 for HCA)
  LinearWeight wgate;        // compressor.wgate  [c·dc, D]
  std::vector<float> ape;    // compressor.ape    [m, c·dc]
  std::vector<float> norm;   // compressor.norm   [dc]
};

struct IndexerWeights {
  LinearWeight wq_b;          // indexer.wq_b          [inh·ihd, ql]
  LinearWeight weights_proj;  // indexer.weights_proj  [inh, D]
  CompressorWeights comp;     // indexer.compressor.*  (dc = ihd, c = 2)
};

struct ExpertWeights {
  LinearWeight w1;  // gate  [I, D]
  LinearWeight w2;  // down  [D, I]
  LinearWeight w3;  // up    [I, D]
};

struct LayerWeights {
  HcWeights hc_attn, hc_ffn;
  std::vector<float> attn_norm;  // attn_norm.weight  [D]
  std::vector<float> ffn_norm;   // ffn_norm.weight   [D]
  // attention
  LinearWeight wq_a;             // attn.wq_a     [ql, D]
  std::vector<float> q_norm;     // attn.q_norm   [ql]
  LinearWeight wq_b;             // attn.wq_b     [H·hd, ql]
  LinearWeight wkv;              // attn.wkv      [hd, D]
  std::vector<float> kv_norm;    // attn.kv_norm  [hd]   (transformers-saved: attn.norm)
  LinearWeight wo_a;             // attn.wo_a     [G·ol, H·hd/G]
  LinearWeight wo_b;             // attn.wo_b     [D, G·ol]
  std::vector<float> sinks;      // attn.attn_sink [H]
  std::unique_ptr<CompressorWeights> compressor;  // CSA/HCA layers only
  std::unique_ptr<IndexerWeights> indexer;        // CSA layers only
  // MoE
  LinearWeight gate;                 // ffn.gate.weight [E, D]
  std::vector<float> gate_bias;      // ffn.gate.bias   [E]      (score-routed layers)
  std::vector<int32_t> tid2eid;      // ffn.gate.tid2eid [vocab, k] (hash-routed layers)
  std::vector<ExpertWeights> experts;  // ffn.experts.{e}  E of them (outside the loaded range: empty)
  ExpertWeights shared;                // ffn.shared_experts
  bool has_shared = false;
};

// One MTP block (spec §8, `mtp.{i}.*`): the next token's embedding and the main model's last hidden
// streams in, one sliding-window, score-routed block, its own HC head and norm out; the embedding and
// the head are the main model's.
struct MtpWeights {
  LinearWeight e_proj;               // mtp.i.e_proj   [D, D]
  LinearWeight h_proj;               // mtp.i.h_proj   [D, D]
  std::vector<float> enorm;          // mtp.i.enorm.weight [D]
  std::vector<float> hnorm;          // mtp.i.hnorm.weight [D]
  std::vector<float> norm;           // mtp.i.norm.weight  [D]
  std::vector<float> hc_head_fn;     // mtp.i.hc_head_fn    [hc, hc·D]
  std::vector<float> hc_head_base;   // mtp.i.hc_head_base  [hc]
  std::vector<float> hc_head_scale;  // mtp.i.hc_head_scale [1]
  LayerWeights block;                // mtp.i.<a layer's keys>: no compressor, gate with bias
};

struct Weights {
  LinearWeight embed;             // embed.weight [vocab, D]  (rows expanded on lookup)
  LinearWeight head;              // head.weight  [vocab, D]
  std::vector<float> norm;        // norm.weight  [D]
  std::vector<float> hc_head_fn;  // hc_head_fn   [hc, hc·D]
  std::vector<float> hc_head_base;   // hc_head_base  [hc]
  std::vector<float> hc_head_scale;  // hc_head_scale [1]
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;    // the MTP blocks, loaded only with LoadOptions::mtp (else empty)
  std::string spelling;  // "release" or "transformers" (key spelling of the checkpoint)
  int64_t experts_first = 0, experts_end = 0;  // the routed experts loaded: [first, end)
};

// A range of routed experts [first, first + count); count < 0 = all of them.
struct ExpertRange {
  int64_t first = 0;
  int64_t count = -1;
};

struct LoadOptions {
  LinearLoadOptions linear;
  // Expert parallelism: only these routed experts are loaded and validated; the
  // others' tensors are never read (their LinearWeight stays empty).
  ExpertRange experts;
  // Load and validate the checkpoint's MTP blocks (all num_nextn_predict_layers of them); an error
  // naming what is missing when the checkpoint or its config has none.
  bool mtp = false;
};

// The [first, end) a range means for a model of E routed experts (errors name the range).
std::pair<int64_t, int64_t> expert_bounds(const ExpertRange& r, int64_t E);

// Loads and validates every tensor; errors name the tensor and expected shape.
Weights weights_load(const TensorStore& store, const Config& cfg, const LoadOptions& opt = {});

// How many MTP blocks the checkpoint stores (the i with any `mtp.{i}.` tensor, in either spelling,
// counted from 0 while they are consecutive).
int64_t checkpoint_mtp_blocks(const TensorStore& store);

// The checkpoint key of a release-spelled name in the given key spelling
// (one explicit table, spec §15.5).
std::string weight_key(const std::string& release_name, const std::string& spelling);

}  // namespace cm
