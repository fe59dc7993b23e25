// The attention block of one layer over a step's rows (many slots).
//
//   qr = RMSNorm(x·wq_aᵀ);  q = per-head unweighted RMSNorm(qr·wq_bᵀ), RoPE
//   kv = RMSNorm(x·wkvᵀ), RoPE                        (one shared K=V head)
//   CSA/HCA: the compressor turns complete blocks of m tokens into entries;
//   CSA: the lightning indexer picks the top-k causal entries per query.
//   o_h = softmax-with-sink over {window rows} ∪ {compressed entries}
//   o_h ← inverse RoPE at the query position; out = wo_b · grouped wo_a · o
//
// Projections multiply all rows of the step at once. The compressor then runs
// per slot over its own state (pending block rows, CSA overlap halves,
// entries), attention per token over its slot's window ring, this step's rows
// of its slot and its slot's entries. The ring is written after every token of
// the layer has read it, so a chunk sees exactly what one long prefill would.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "backend/cpu/cpu_backend.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/kv_quant.h"
#include "ops/norm.h"

namespace cm {

namespace {

// Feeds a segment's projected rows (kv, gate: batch arrays [n, c·dc]) into one
// compressor and writes every block it completes as an entry (spec'd pooling:
// CSA slots = previous block's A halves + this block's B halves, c = 2; HCA,
// c = 1, the block itself; a gate is its raw row + ape[position mod m]). The
// pending rings keep the last c·m positions (row p mod c·m), so the previous
// block is still there when the next one completes. Entry i is normed and
// RoPE'd at position i·m, then rounded as the FP8 cache stores it (round: an
// attention entry, an indexer key, or none). Returns the index of the first
// entry written and sets *written.
enum class EntryRound { NONE, KV, INDEX_KEY };
int64_t compressor_feed(const CompressorWeights& cw, CompressorSlot& cs, int64_t m, int64_t c, int64_t dc, float eps,
                        const RopeTable& rope, const float* kv, const float* gate, const Segment& s,
                        CpuActivations& a, EntryRound round, int64_t* written) {
  const int64_t width = c * dc, cm = c * m;
  *written = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t p = s.pos0 + i, r = s.row0 + i, row = p % cm;
    std::memcpy(cs.pend_kv + row * width, kv + r * width, size_t(width) * 4);
    std::memcpy(cs.pend_gate + row * width, gate + r * width, size_t(width) * 4);
    if ((p + 1) % m != 0) continue;
    const int64_t blk = (p + 1) / m - 1;
    // The pooled slots in order: CSA's previous block A halves (none for block 0), then this
    // block's B halves (HCA: the whole block).
    float *pk = a.pool_kv.data(), *pg = a.pool_gate.data();
    int64_t slots = 0;
    auto take = [&](int64_t q, int64_t col0) {
      const float* kr = cs.pend_kv + (q % cm) * width + col0;
      const float* gr = cs.pend_gate + (q % cm) * width + col0;
      const float* ape = &cw.ape[size_t((q % m) * width + col0)];
      for (int64_t d = 0; d < dc; ++d) {
        pk[slots * dc + d] = kr[d];
        pg[slots * dc + d] = gr[d] + ape[d];
      }
      ++slots;
    };
    if (c == 2) {
      for (int64_t j = 0; j < m; ++j) {
        if (blk > 0) {
          take((blk - 1) * m + j, 0);
        } else {  // no previous block: a −inf gate weighs nothing
          std::fill(pk + slots * dc, pk + (slots + 1) * dc, 0.0f);
          std::fill(pg + slots * dc, pg + (slots + 1) * dc, -INFINITY);
          ++slots;
        }
      }
    }
    for (int64_t j = 0; j < m; ++j) take(blk * m + j, c == 2 ? dc : 0);
    float* entry = cs.entries + blk * dc;
    compress_pool_cpu(pk, pg, slots, dc, a.entry.data());
    rms_norm_cpu(a.entry.data(), cw.norm.data(), 1, dc, eps, entry);
    rope_apply_cpu(entry, 1, dc, blk * m, rope, false);
    if (round == EntryRound::KV) kv_fp8_round_cpu(entry, 1, dc, rope.rope_dim);
    if (round == EntryRound::INDEX_KEY) index_key_fp8_round_cpu(entry, 1, dc);
    ++*written;
  }
  return s.pos0 / m;  // the block holding the segment's first position is the first one completed
}

}  // namespace

void attention_kv(CpuBackend& be, const LayerWeights& lw, const RopeTable& rope, const float* x, int64_t n,
                  const int32_t* pos, float* kv) {
  const Config& c = be.model().config;
  const int64_t hd = c.head_dim;
  be.linear(lw.wkv, x, n, kv);
  rms_norm_cpu(kv, lw.kv_norm.data(), n, hd, c.rms_norm_eps, kv);
#pragma omp parallel for schedule(static) if (n >= 64)
  for (int64_t t = 0; t < n; ++t) rope_apply_cpu(kv + t * hd, 1, hd, pos[t], rope, false);
  // The FP8 cache: the rows this step attends to are the ones the window keeps.
  if (be.options().kv_cache == KvCache::FP8) kv_fp8_round_cpu(kv, n, hd, rope.rope_dim);
}

void attention_block(CpuBackend& be, int64_t L, const float* x, float* out) {
  const Model& mdl = be.model();
  const Config& c = mdl.config;
  const LayerWeights& lw = be.layer_weights(L);
  const Batch& b = be.batch();
  CpuActivations& a = be.act();
  const AttnKind kind = be.layer_kind(L);
  const RopeTable& rope = kind == AttnKind::SLIDING ? mdl.rope_main : mdl.rope_compress;
  const int64_t N = b.n, H = c.num_heads, hd = c.head_dim, W = c.sliding_window, G = c.o_groups, ol = c.o_lora_rank;
  const int64_t ql = c.q_lora_rank, inh = c.index_n_heads, ihd = c.index_head_dim, topk = c.index_topk;
  const float eps = c.rms_norm_eps;

  // Queries and the shared KV head, for every row of the step.
  float *qr = a.qr.data(), *q = a.q.data(), *kv = a.kv.data();
  be.linear(lw.wq_a, x, N, qr);
  rms_norm_cpu(qr, lw.q_norm.data(), N, ql, eps, qr);
  be.linear(lw.wq_b, qr, N, q);
  rms_norm_cpu(q, nullptr, N * H, hd, eps, q);
  attention_kv(be, lw, rope, x, N, b.pos, kv);
#pragma omp parallel for schedule(static) if (N * H >= 64)
  for (int64_t t = 0; t < N; ++t) rope_apply_cpu(q + t * H * hd, H, hd, b.pos[t], rope, false);
  be.note("q", L, q, H * hd, {H, hd});
  be.note("kv", L, kv, hd, {hd});

  // Compressed entries, per slot (and, for CSA, the indexer's keys).
  const int64_t m = lw.compressor ? c.ratio(L) : 0;
  if (lw.compressor) {
    const int64_t cc = kind == AttnKind::CSA ? 2 : 1;
    be.linear(lw.compressor->wkv, x, N, a.ckv.data());
    be.linear(lw.compressor->wgate, x, N, a.cgate.data());
    if (kind == AttnKind::CSA) {
      be.linear(lw.indexer->comp.wkv, x, N, a.ikv.data());
      be.linear(lw.indexer->comp.wgate, x, N, a.igate.data());
      be.linear(lw.indexer->wq_b, qr, N, a.iq.data());
      be.linear(lw.indexer->weights_proj, x, N, a.iw.data());
    }
    const bool fp8 = be.options().kv_cache == KvCache::FP8;
    for (const Segment& s : be.plan()) {
      LayerSlot ls = be.layer_slot(s.slot, L);
      int64_t n_new = 0;
      const int64_t first = compressor_feed(*lw.compressor, ls.comp, m, cc, hd, eps, mdl.rope_compress, a.ckv.data(),
                                            a.cgate.data(), s, a, fp8 ? EntryRound::KV : EntryRound::NONE, &n_new);
      if (n_new > 0) be.note_slot("entries", L, s, ls.comp.entries + first * hd, n_new, hd, {hd});
      if (kind == AttnKind::CSA) {
        const int64_t ifirst = compressor_feed(lw.indexer->comp, ls.index, m, 2, ihd, eps, mdl.rope_compress,
                                               a.ikv.data(), a.igate.data(), s, a,
                                               fp8 ? EntryRound::INDEX_KEY : EntryRound::NONE, &n_new);
        if (n_new > 0) be.note_slot("index_keys", L, s, ls.index.entries + ifirst * ihd, n_new, ihd, {ihd});
      }
    }
  }

  // Attention per query token over its slot's window rows ∪ compressed entries.
  float* o = a.o.data();
  const float scale = 1.0f / std::sqrt(float(hd));
  const float wscale = 1.0f / std::sqrt(float(inh));
#pragma omp parallel for schedule(dynamic) num_threads(be.threads()) if (N > 1)
  for (int64_t t = 0; t < N; ++t) {
    CpuActivations::Thread& th = a.threads[size_t(omp_get_thread_num())];
    const Segment& s = be.plan().segs[size_t(be.plan().seg_of_row[size_t(t)])];
    const LayerSlot ls = be.layer_slot(s.slot, L);
    const int64_t p = b.pos[t];
    const float** ent = th.ent.data();
    int64_t n = 0;
    for (int64_t j = std::max<int64_t>(0, p - W + 1); j <= p; ++j)
      ent[n++] = j < s.pos0 ? ls.window + (j % W) * hd : kv + (s.row0 + (j - s.pos0)) * hd;
    if (kind == AttnKind::HCA) {
      for (int64_t i = 0; i < (p + 1) / m; ++i) ent[n++] = ls.comp.entries + i * hd;
    } else if (kind == AttnKind::CSA) {
      // Lightning indexer: top-k causal entries by Σ_h w_h·ReLU(q_h·K_i)·ihd^−½.
      float* qt = a.iq.data() + t * inh * ihd;
      rope_apply_cpu(qt, inh, ihd, p, mdl.rope_compress, false);
      float wt[512];
      CM_CHECK(inh <= 512, "indexer: {} heads above 512", inh);
      for (int64_t h = 0; h < inh; ++h) wt[h] = a.iw[size_t(t * inh + h)] * wscale;
      const int64_t nc = (p + 1) / m;
      indexer_scores_cpu(qt, ls.index.entries, nc, wt, inh, ihd, th.iscore.data(), th.iscratch.data(),
                         th.irows.data());
      int32_t* sel = a.sel.data() + t * topk;
      const int64_t k = topk_lower_index_first(th.iscore.data(), nc, topk, th.itopk.data(), sel);
      a.n_sel[size_t(t)] = int32_t(k);
      for (int64_t j = 0; j < topk; ++j) a.sel_score[size_t(t * topk + j)] = j < k ? th.iscore[size_t(sel[j])] : 0.0f;
      for (int64_t j = 0; j < k; ++j) ent[n++] = ls.comp.entries + sel[j] * hd;
    }
    float* ot = o + t * H * hd;
    attention_sink_cpu(q + t * H * hd, ent, n, lw.sinks.data(), H, hd, scale, ot, th.scores.data());
    rope_apply_cpu(ot, H, hd, p, rope, true);
  }
  if (kind == AttnKind::CSA) be.note("index_top_scores", L, a.sel_score.data(), topk, {topk});
  be.note("attn_core", L, o, H * hd, {H, hd});

  // The window ring keeps each slot's last W rows for the next step.
  for (const Segment& s : be.plan()) {
    const LayerSlot ls = be.layer_slot(s.slot, L);
    for (int64_t j = std::max<int64_t>(0, s.n - W); j < s.n; ++j)
      std::memcpy(ls.window + ((s.pos0 + j) % W) * hd, kv + (s.row0 + j) * hd, size_t(hd) * 4);
  }

  // Grouped low-rank output projection: group g's heads go through rows
  // [g·ol, (g+1)·ol) of wo_a.
  const int64_t gin = H * hd / G;
  for (int64_t g = 0; g < G; ++g) be.linear(lw.wo_a, o + g * gin, N, a.u.data() + g * ol, H * hd, G * ol, g * ol, ol);
  be.linear(lw.wo_b, a.u.data(), N, out);
}

}  // namespace cm
