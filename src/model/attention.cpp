// The attention block of one layer (spec §5) over a chunk of T tokens.
//
//   qr = RMSNorm(x·wq_aᵀ);  q = per-head unweighted RMSNorm(qr·wq_bᵀ), RoPE
//   kv = RMSNorm(x·wkvᵀ), RoPE                        (one shared K=V head)
//   CSA/HCA: the compressor turns complete blocks of m tokens into entries;
//   CSA: the lightning indexer picks the top-k causal entries per query.
//   o_h = softmax-with-sink over {window rows} ∪ {compressed entries}
//   o_h ← inverse RoPE at the query position; out = wo_b · grouped wo_a · o
//
// The state keeps the last window−1 KV rows, each compressor's incomplete
// block (gates with `ape` added), the CSA overlap half and all entries; so a
// chunk sees exactly what one long prefill would have seen.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "model/model.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/norm.h"

namespace cm {

namespace {

std::vector<float> lin(const LinearWeight& w, const float* x, int64_t T, const ForwardOptions& opt) {
  std::vector<float> y(size_t(T * w.out_features));
  linear_cpu(w, x, T, y.data(), opt.act_quant);
  return y;
}

// Feeds T projected rows into a compressor and emits every completed entry
// (spec §5.5). c = 2 (CSA, overlapping: slots = previous block's A halves +
// this block's B halves) or 1 (HCA). Entries are normed and RoPE'd at i·m.
void compressor_update(const CompressorWeights& cw, CompressorState& cs, int64_t m, int64_t c, int64_t dc,
                       float eps, const RopeTable& rope, const float* x, int64_t T, int64_t pos0,
                       const ForwardOptions& opt) {
  const int64_t width = c * dc;
  std::vector<float> kv = lin(cw.wkv, x, T, opt), gate = lin(cw.wgate, x, T, opt);
  for (int64_t t = 0; t < T; ++t) {
    const float* ape = &cw.ape[size_t(((pos0 + t) % m) * width)];
    for (int64_t j = 0; j < width; ++j) gate[size_t(t * width + j)] += ape[j];
  }
  cs.pend_kv.insert(cs.pend_kv.end(), kv.begin(), kv.end());
  cs.pend_gate.insert(cs.pend_gate.end(), gate.begin(), gate.end());
  cs.n_pend += T;

  std::vector<float> slot_kv(size_t(2 * m * dc)), slot_gate(size_t(2 * m * dc)), entry(static_cast<size_t>(dc));
  int64_t consumed = 0;
  while (cs.n_pend - consumed >= m) {
    const float* bk = &cs.pend_kv[size_t(consumed * width)];
    const float* bg = &cs.pend_gate[size_t(consumed * width)];
    int64_t slots;
    if (c == 1) {
      slots = m;
      std::copy(bk, bk + m * dc, slot_kv.begin());
      std::copy(bg, bg + m * dc, slot_gate.begin());
    } else {
      slots = 2 * m;
      for (int64_t s = 0; s < m; ++s) {
        for (int64_t j = 0; j < dc; ++j) {
          slot_kv[size_t(s * dc + j)] = cs.has_prev ? cs.prev_kv[size_t(s * dc + j)] : 0.0f;
          slot_gate[size_t(s * dc + j)] = cs.has_prev ? cs.prev_gate[size_t(s * dc + j)] : -INFINITY;
          slot_kv[size_t((m + s) * dc + j)] = bk[s * width + dc + j];
          slot_gate[size_t((m + s) * dc + j)] = bg[s * width + dc + j];
        }
      }
      cs.prev_kv.resize(size_t(m * dc));
      cs.prev_gate.resize(size_t(m * dc));
      for (int64_t s = 0; s < m; ++s)
        for (int64_t j = 0; j < dc; ++j) {
          cs.prev_kv[size_t(s * dc + j)] = bk[s * width + j];
          cs.prev_gate[size_t(s * dc + j)] = bg[s * width + j];
        }
      cs.has_prev = true;
    }
    compress_pool_cpu(slot_kv.data(), slot_gate.data(), slots, dc, entry.data());
    rms_norm_cpu(entry.data(), cw.norm.data(), 1, dc, eps, entry.data());
    rope_apply_cpu(entry.data(), 1, dc, cs.n_entries * m, rope, false);
    cs.entries.insert(cs.entries.end(), entry.begin(), entry.end());
    ++cs.n_entries;
    consumed += m;
  }
  cs.pend_kv.erase(cs.pend_kv.begin(), cs.pend_kv.begin() + consumed * width);
  cs.pend_gate.erase(cs.pend_gate.begin(), cs.pend_gate.begin() + consumed * width);
  cs.n_pend -= consumed;
}

// Lightning indexer (spec §5.7): for each query, the indices of the top-k
// causal entries by Σ_h w_h·ReLU(q_h·K_i)·ihd^−½ (ties: lower index first).
std::vector<std::vector<int32_t>> indexer_select(const Model& mdl, const IndexerWeights& iw, const CompressorState& ks,
                                                 const float* x, const float* qr, int64_t T, int64_t pos0,
                                                 const ForwardOptions& opt) {
  const Config& c = mdl.config;
  const int64_t nh = c.index_n_heads, ihd = c.index_head_dim, m = c.csa_ratio;
  std::vector<float> q = lin(iw.wq_b, qr, T, opt);  // [T, nh·ihd]
  std::vector<float> wts = lin(iw.weights_proj, x, T, opt);  // [T, nh]
  const float wscale = 1.0f / std::sqrt(float(nh));
  std::vector<std::vector<int32_t>> sel(static_cast<size_t>(T));
#pragma omp parallel for schedule(dynamic) if (T * nh * ihd * ks.n_entries >= (int64_t(1) << 16))
  for (int64_t t = 0; t < T; ++t) {
    float* qt = &q[size_t(t * nh * ihd)];
    rope_apply_cpu(qt, nh, ihd, pos0 + t, mdl.rope_compress, false);
    const int64_t n_causal = std::min((pos0 + t + 1) / m, ks.n_entries);
    std::vector<float> score(static_cast<size_t>(n_causal)), w(static_cast<size_t>(nh));
    for (int64_t h = 0; h < nh; ++h) w[size_t(h)] = wts[size_t(t * nh + h)] * wscale;
    indexer_scores_cpu(qt, ks.entries.data(), n_causal, w.data(), nh, ihd, score.data());
    sel[size_t(t)] = topk_lower_index_first(score.data(), n_causal, c.index_topk);
  }
  return sel;
}

}  // namespace

void attention_block(const Model& mdl, int64_t L, LayerState& st, int64_t pos0, const float* x, int64_t T,
                     float* out, const ForwardOptions& opt) {
  const Config& c = mdl.config;
  const LayerWeights& lw = mdl.weights.layers[size_t(L)];
  const AttnKind kind = c.attn_kinds[size_t(L)];
  const RopeTable& rope = kind == AttnKind::SLIDING ? mdl.rope_main : mdl.rope_compress;
  const int64_t H = c.num_heads, hd = c.head_dim, W = c.sliding_window, G = c.o_groups, ol = c.o_lora_rank;
  const float eps = c.rms_norm_eps;

  // Queries and the shared KV head.
  std::vector<float> qr = lin(lw.wq_a, x, T, opt);
  rms_norm_cpu(qr.data(), lw.q_norm.data(), T, c.q_lora_rank, eps, qr.data());
  std::vector<float> q = lin(lw.wq_b, qr.data(), T, opt);  // [T, H, hd]
  rms_norm_cpu(q.data(), nullptr, T * H, hd, eps, q.data());
  std::vector<float> kv = lin(lw.wkv, x, T, opt);  // [T, hd]
  rms_norm_cpu(kv.data(), lw.kv_norm.data(), T, hd, eps, kv.data());
  for (int64_t t = 0; t < T; ++t) {
    rope_apply_cpu(&q[size_t(t * H * hd)], H, hd, pos0 + t, rope, false);
    rope_apply_cpu(&kv[size_t(t * hd)], 1, hd, pos0 + t, rope, false);
  }

  // Compressed entries (and, for CSA, the indexer's choice among them).
  std::vector<std::vector<int32_t>> selected;
  if (lw.compressor) {
    const int64_t m = c.ratio(L), cc = kind == AttnKind::CSA ? 2 : 1;
    compressor_update(*lw.compressor, st.comp, m, cc, hd, eps, mdl.rope_compress, x, T, pos0, opt);
    if (kind == AttnKind::CSA) {
      compressor_update(lw.indexer->comp, st.index_comp, m, 2, c.index_head_dim, eps, mdl.rope_compress, x, T, pos0,
                        opt);
      selected = indexer_select(mdl, *lw.indexer, st.index_comp, x, qr.data(), T, pos0, opt);
    }
  }

  // Attention per query token over window rows ∪ compressed entries.
  std::vector<float> o(size_t(T * H * hd));
  const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel for schedule(dynamic) if (T * H * hd * std::min<int64_t>(pos0 + T, W) >= (int64_t(1) << 16))
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = pos0 + t;
    std::vector<const float*> ent;
    const int64_t first = std::max<int64_t>(0, p - W + 1);
    for (int64_t s = first; s <= p; ++s) {
      if (s < pos0) ent.push_back(&st.window[size_t((st.n_window - (pos0 - s)) * hd)]);
      else ent.push_back(&kv[size_t((s - pos0) * hd)]);
    }
    if (kind == AttnKind::HCA) {
      const int64_t n = std::min((p + 1) / c.hca_ratio, st.comp.n_entries);
      for (int64_t i = 0; i < n; ++i) ent.push_back(&st.comp.entries[size_t(i * hd)]);
    } else if (kind == AttnKind::CSA) {
      for (int32_t i : selected[size_t(t)]) ent.push_back(&st.comp.entries[size_t(i * hd)]);
    }
    float* ot = &o[size_t(t * H * hd)];
    attention_sink_cpu(&q[size_t(t * H * hd)], ent.data(), int64_t(ent.size()), lw.sinks.data(), H, hd, scale, ot);
    rope_apply_cpu(ot, H, hd, p, rope, true);
  }

  // Keep the last W−1 KV rows for the next chunk.
  st.window.insert(st.window.end(), kv.begin(), kv.end());
  st.n_window += T;
  if (st.n_window > W - 1) {
    const int64_t drop = st.n_window - (W - 1);
    st.window.erase(st.window.begin(), st.window.begin() + drop * hd);
    st.n_window = W - 1;
  }

  // Grouped low-rank output projection (spec §5.3): group g's heads go
  // through rows [g·ol, (g+1)·ol) of wo_a.
  const int64_t gin = H * hd / G;
  std::vector<float> og(size_t(T * gin)), u(size_t(T * G * ol)), ug(size_t(T * ol));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(&og[size_t(t * gin)], &o[size_t(t * H * hd + g * gin)], size_t(gin) * 4);
    linear_cpu_rows(lw.wo_a, g * ol, ol, og.data(), T, ug.data(), opt.act_quant);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(&u[size_t(t * G * ol + g * ol)], &ug[size_t(t * ol)], size_t(ol) * 4);
  }
  linear_cpu(lw.wo_b, u.data(), T, out, opt.act_quant);
}

}  // namespace cm
