// The attention half of a CUDA layer (CudaBackend::attention), in the order and math of
// model/attention.cpp.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <cmath>

#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace cm {

// order and math of model/attention.cpp.
void CudaBackend::attention(int64_t L, int64_t n, int64_t max_pos) {
  const Config& c = m_.config;
  const cuda::DevLayer& lw = dev_layer(L);
  LayerState& ls = layers_[size_t(L)];
  Context& ctx = *ctx_;
  Act& a = act_;
  const AttnKind kind = attn_kind(L);
  const RopeView& rope = kind == AttnKind::SLIDING ? dm_->rope_main : dm_->rope_compress;
  const int64_t H = c.num_heads, hd = c.head_dim, W = c.sliding_window, G = c.o_groups, ol = c.o_lora_rank;
  const int64_t ql = c.q_lora_rank, inh = c.index_n_heads, ihd = c.index_head_dim, topk = c.index_topk;
  const float eps = c.rms_norm_eps;
  // normed and qr come with their bf16 copies (written by their norms) for the FP8/NVFP4 linears.
  const float* normed = P<float>(a.normed);
  const uint16_t* normed_bf = P<uint16_t>(a.normed_bf);
  uint16_t* qr_bf = P<uint16_t>(a.qr_bf);

  // Compressed entries per slot (and, for CSA, the indexer's keys and head weights) read only the normed
  // rows: they run on the side stream beside the query path (on_side), joined before the indexer's scores.
  const int64_t m = L < c.num_layers ? c.ratio(L) : 0;
  float *ikv = P<float>(a.ikv), *igate = P<float>(a.igate), *iqf = P<float>(a.iqf), *iw = P<float>(a.iw);
  if (lw.comp || kind == AttnKind::CSA) on_side(n, [&] {
    Context& sc = *ctx_;  // the side stream's (or the main one's when the step runs without branches)
    if (lw.comp) {
      float *ckv = P<float>(a.ckv), *cgate = P<float>(a.cgate);
      linear2(lw.comp->wkv, normed, normed_bf, n, ckv);
      linear2(lw.comp->wgate, normed, normed_bf, n, cgate);
      cuda::OpScope op(sc, "compressor_step");
      compressor_step_cuda(sc, ls.comp, lw.comp->ape.p(), lw.comp->norm.p(), eps, dm_->rope_compress, ckv, cgate,
                           d_slot_, d_pos_, n);
    }
    if (kind == AttnKind::CSA) {
      linear2(lw.index_comp->wkv, normed, normed_bf, n, ikv);
      linear2(lw.index_comp->wgate, normed, normed_bf, n, igate);
      linear2(lw.index_weights_proj, normed, normed_bf, n, iw);
      {
        cuda::OpScope op(sc, "compressor_step (indexer)");
        compressor_step_cuda(sc, ls.index, lw.index_comp->ape.p(), lw.index_comp->norm.p(), eps, dm_->rope_compress,
                             ikv, igate, d_slot_, d_pos_, n);
      }
      cuda::OpScope op(sc, "scale");
      cuda::scale_f32(sc, iw, n * inh, 1.0f / std::sqrt(float(inh)));
    }
  });

  // Queries and the shared KV head, for every row of the step.
  float *qr = P<float>(a.qr), *qf = P<float>(a.qf), *kvf = P<float>(a.kvf);
  uint16_t *q = P<uint16_t>(a.q_bf), *kv = P<uint16_t>(a.kv_bf);
  // q_a and kv at decode: one launch for both (run_linear_pair: each output with its own launch's bits).
  if (!linear_pair("attn.wq_a+wkv", lw.wq_a, lw.wkv, normed_bf, n, qr, kvf)) {
    linear2(lw.wq_a, normed, normed_bf, n, qr);
    linear2(lw.wkv, normed, normed_bf, n, kvf);
  }
  {
    cuda::OpScope op(ctx, "rms_norm");
    rms_norm_cuda(ctx, qr, lw.q_norm.p(), n, ql, eps, qr, false, nullptr, nullptr, 1, qr_bf);
  }
  linear2(lw.wq_b, qr, qr_bf, n, qf);
  // The per-head Q norm + RoPE and the KV norm + RoPE (rows of hd both) in one launch.
  {
    cuda::OpScope op(ctx, "rms_norm+rope (q, kv)");
    rms_norm2_cuda(ctx, RmsNormJob{qf, nullptr, n * H, hd, eps, q, true, &rope, d_pos_, H},
                   RmsNormJob{kvf, lw.kv_norm.p(), n, hd, eps, kv, true, &rope, d_pos_, 1});
  }
  note("q", L, q, true, H * hd, {H, hd});
  note("kv", L, kv, true, hd, {hd});
  uint16_t* iq = P<uint16_t>(a.iq_bf);
  if (kind == AttnKind::CSA) {
    // The indexer's queries (from qr, so on this stream): q_h with RoPE.
    linear2(lw.index_wq_b, qr, qr_bf, n, iqf);
    cuda::OpScope op(ctx, "rope (indexer)");
    rope_cuda(ctx, iqf, false, iq, true, n * inh, ihd, d_pos_, inh, dm_->rope_compress, false);
  }
  join_side();
  if (lw.comp) observe_entries(L, ls.comp, kind == AttnKind::CSA ? &ls.index : nullptr);
  if (kind == AttnKind::CSA) {
    float* iscore = P<float>(a.iscore);
    float* sel_score = P<float>(a.sel_score);
    int32_t* sel = P<int32_t>(a.sel);
    // Lightning indexer: top-k causal entries by Σ_h w_h·ReLU(q_h·K_i)·ihd^−½, w scaled by inh^−½.
    const int64_t ld = ls.index.max_entries;
    {
      cuda::OpScope op(ctx, "indexer_scores");
      indexer_scores_cuda(ctx, ls.index, iq, iw, inh, d_slot_, d_pos_, n, std::min(ld, (max_pos + 1) / m), iscore, ld);
    }
    {
      cuda::OpScope op(ctx, "indexer_topk");
      topk_lower_index_first_cuda(ctx, iscore, ld, d_pos_, m, n, topk, sel);
    }
    {
      cuda::OpScope op(ctx, "gather_scores");
      cuda::gather_scores(ctx, iscore, ld, sel, n, topk, sel_score);
    }
    note("index_top_scores", L, sel_score, false, topk, {topk});
  }

  // Attention per query token over its slot's window rows ∪ compressed entries.
  uint16_t* o = P<uint16_t>(a.o_bf);
  AttnInputs in;
  in.kv = kv;
  in.window = ls.window;
  in.W = W;
  in.sinks = lw.sinks.p();
  in.workspace = P<float>(a.attn_ws);
  in.workspace_floats = int64_t(a.attn_ws.size() / 4);
  if (kind != AttnKind::SLIDING) {
    in.entries = ls.comp.entries;
    in.max_entries = ls.comp.max_entries;
    in.ratio = m;
    if (kind == AttnKind::CSA) {
      in.sel = P<int32_t>(a.sel);
      in.topk = topk;
    }
  }
  {
    cuda::OpScope op(ctx, kind == AttnKind::SLIDING ? "attention (window)"
                          : kind == AttnKind::CSA   ? "attention (CSA)"
                                                    : "attention (HCA)");
    attention_sink_cuda(ctx, in, q, H, hd, 1.0f / std::sqrt(float(hd)), rope, d_slot_, d_pos_, n, o);
  }
  note("attn_core", L, o, true, H * hd, {H, hd});
  // The window ring keeps each slot's last W rows for the next step.
  {
    cuda::OpScope op(ctx, "window_store");
    window_store_cuda(ctx, kv, ls.window, W, hd, d_slot_, d_pos_, n);
  }

  // Grouped low-rank output projection (group g's heads through rows [g·ol, (g+1)·ol) of wo_a), then wo_b.
  // For an FP8/NVFP4 wo_b, wo_a writes bf16: the bits of its f32 output cast (every such kernel stores
  // the round-to-nearest-even of its f32 value), without the cast kernel.
  const bool ub = lw.wo_a.wants_bf16_input() && lw.wo_b.wants_bf16_input();
  void* u = ub ? static_cast<void*>(P<uint16_t>(a.u_bf)) : static_cast<void*>(P<float>(a.u));
  {
    cuda::OpScope op(ctx, op_label(lw.wo_a.name));
    cuda::run_linear(ctx, lw.wo_a, o, true, n, H * hd, u, ub, G * ol, P<uint16_t>(a.cast), opt_.batch_invariant);
  }
  linear(lw.wo_b, u, ub, n, P<float>(a.out));
}

}  // namespace cm
