// GPU attention-side ops (op table, check-only cases: attention_*) against CPU references on random inputs, with
// batches that mix slots, prefill chunks longer than the window, decode
// tokens and contexts past 4K:
//  - compressor_step_cuda (CSA 4 × 512 / 4 × 128, HCA 128 × 512, tiny
//    fixture shapes) over several steps: every entry against pooling,
//    RMSNorm and RoPE of the full history with the CPU ops;
//  - indexer_scores_cuda (64 heads × 128, > 1000 entries) against
//    indexer_scores_cpu, and topk_lower_index_first_cuda against the CPU
//    top-k on the same scores (exact indices, many exact ties);
//  - attention_sink_cuda (64 heads × 512, rope 64, window 128, top-k 512 of
//    > 512 entries; HCA; window only; 128 heads; tiny; head groups of fewer
//    than 16 heads and head sizes 8..256 for the tensor-core tile and the SIMT
//    fallback) against attention_sink_cpu + inverse RoPE, and
//    window_store_cuda (exact ring); its split (decode) path gives the in-CTA
//    path's bits on the same inputs, and a token run alone its batch's bits.
// Metric max|gpu − cpu| / max|cpu|; bf16 outputs (entries, attention) are
// bounded by 8e-3 (bf16 rounding costs up to 2^-8 ≈ 3.9e-3 of max|ref|, twice
// as margin), f32 index scores by 1e-5 (fp32 sums over 64 × 128 terms in
// another order).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bench/optable/op_case.h"
#include "bench/optable/op_util.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace cm::optable {
namespace {



// A batch: runs of (slot, first position, length), contiguous per slot.
struct SlotRun {
  int32_t slot, pos0, len;
};
struct BatchRows {
  std::vector<int32_t> slot, pos;
  explicit BatchRows(const std::vector<SlotRun>& runs) {
    for (const SlotRun& r : runs)
      for (int32_t k = 0; k < r.len; ++k) {
        slot.push_back(r.slot);
        pos.push_back(r.pos0 + k);
      }
  }
  int64_t n() const { return int64_t(slot.size()); }
};

std::string sh(const std::string& s, int64_t n) { return s + " tokens=" + std::to_string(n); }

// ---------------------------------------------------------------- compressor

struct CompCase {
  int64_t m, c, dc, rope_dim;
  const char* name;
};

void CompressorEntriesOverSteps(cuda::Context& ctx, Checker& chk_) {
    const CompCase cases[] = {{4, 2, 512, 64, "CSA m=4 dc=512"},
                            {4, 2, 128, 64, "CSA m=4 dc=128 (indexer)"},
                            {128, 1, 512, 64, "HCA m=128 dc=512"},
                            {16, 1, 32, 8, "HCA m=16 dc=32"},
                            {4, 2, 32, 8, "CSA m=4 dc=32"}};
  // Steps: mixed prefill chunks (longer than c·m), decode tokens, and a chunk past 4K.
  const std::vector<std::vector<SlotRun>> steps = {
      {{0, 0, 37}, {2, 0, 5}},
      {{0, 37, 1}, {1, 0, 300}, {2, 5, 7}},
      {{0, 38, 262}, {2, 12, 1}},
      {{1, 300, 1}, {0, 300, 400}},
      {{1, 301, 4099}, {2, 13, 3}},
  };
  const int64_t max_slots = 3, max_ctx = 4400;
  for (const CompCase& cc : cases) {
    Rng r(uint64_t(cc.m * 1000 + cc.dc));
    const int64_t width = cc.c * cc.dc, cm = cc.c * cc.m, max_entries = max_ctx / cc.m;
    const RopeTable tab = make_rope(cc.rope_dim, true);
    std::vector<float> ape = rand_f32(size_t(cc.m * width), r, 0.5f);
    std::vector<float> norm_w = rand_f32(size_t(cc.dc), r, 0.3f, 1.0f);
    cuda::DeviceBuffer dape = to_device(ape), dnorm = to_device(norm_w), dfreq = to_device(tab.freqs);
    cuda::DeviceBuffer pend_kv(size_t(max_slots * cm * width) * 4), pend_gate(size_t(max_slots * cm * width) * 4);
    Guarded<uint16_t> entries(size_t(max_slots * max_entries * cc.dc));
    CompressorStateView st{pend_kv.as<float>(), pend_gate.as<float>(), entries.ptr(), max_slots, max_entries,
                           cc.m, cc.c, cc.dc};
    RopeView rv{dfreq.as<float>(), cc.rope_dim, 1.0f};
    std::vector<std::vector<float>> hkv(static_cast<size_t>(max_slots)), hgate(static_cast<size_t>(max_slots));
    for (const auto& runs : steps) {
      BatchRows b(runs);
      std::vector<float> kv = rand_f32(size_t(b.n() * width), r, 1.0f);
      std::vector<float> gate = rand_f32(size_t(b.n() * width), r, 2.0f);
      for (int64_t i = 0; i < b.n(); ++i) {
        auto& hk = hkv[size_t(b.slot[size_t(i)])];
        auto& hg = hgate[size_t(b.slot[size_t(i)])];
        if (!((int64_t(hk.size())) == (int64_t(b.pos[size_t(i)]) * width))) { chk_.expect(false, Msg() << "ASSERT_EQ(int64_t(hk.size()), int64_t(b.pos[size_t(i)]) * width)"); return; }
        hk.insert(hk.end(), kv.begin() + i * width, kv.begin() + (i + 1) * width);
        hg.insert(hg.end(), gate.begin() + i * width, gate.begin() + (i + 1) * width);
      }
      cuda::DeviceBuffer dkv = to_device(kv), dgate = to_device(gate), ds = to_device(b.slot), dp = to_device(b.pos);
      compressor_step_cuda(ctx, st, dape.as<float>(), dnorm.as<float>(), 1e-6f, rv, dkv.as<float>(),
                           dgate.as<float>(), ds.as<int32_t>(), dp.as<int32_t>(), b.n());
      ctx.sync();
    }
    // Reference: every completed entry pooled from the full history.
    std::vector<uint16_t> got = entries.get(chk_);
    std::vector<float> g_all, r_all;
    std::vector<float> skv(size_t(cm * cc.dc)), sgate(size_t(cm * cc.dc)), e(static_cast<size_t>(cc.dc));
    int64_t n_entries = 0;
    for (int64_t s = 0; s < max_slots; ++s) {
      const int64_t len = int64_t(hkv[size_t(s)].size()) / width;
      for (int64_t ei = 0; ei < len / cc.m; ++ei) {
        for (int64_t k = 0; k < cm; ++k) {
          const int64_t q = (cc.c == 2 ? (ei - 1) * cc.m : ei * cc.m) + k;
          const int64_t col0 = (cc.c == 2 && k >= cc.m) ? cc.dc : 0;
          for (int64_t ch = 0; ch < cc.dc; ++ch) {
            if (q < 0) {
              skv[size_t(k * cc.dc + ch)] = 0.f;
              sgate[size_t(k * cc.dc + ch)] = -INFINITY;
            } else {
              skv[size_t(k * cc.dc + ch)] = hkv[size_t(s)][size_t(q * width + col0 + ch)];
              sgate[size_t(k * cc.dc + ch)] =
                  hgate[size_t(s)][size_t(q * width + col0 + ch)] + ape[size_t((q % cc.m) * width + col0 + ch)];
            }
          }
        }
        compress_pool_cpu(skv.data(), sgate.data(), cm, cc.dc, e.data());
        rms_norm_cpu(e.data(), norm_w.data(), 1, cc.dc, 1e-6f, e.data());
        rope_apply_cpu(e.data(), 1, cc.dc, ei * cc.m, tab, false);
        for (int64_t ch = 0; ch < cc.dc; ++ch) {
          r_all.push_back(e[size_t(ch)]);
          g_all.push_back(bf16_to_f32(got[size_t((s * max_entries + ei) * cc.dc + ch)]));
        }
        ++n_entries;
      }
    }
    if (!((n_entries) > (0))) { chk_.expect(false, Msg() << "ASSERT_GT(n_entries, 0)"); return; }
    err(chk_, "compressor entries", std::string(cc.name) + " entries=" + std::to_string(n_entries), max_rel(g_all, r_all), 8e-3);
  }
}

// ---------------------------------------------------------------- indexer and top-k

void IndexerScoresAndTopk(cuda::Context& ctx, Checker& chk_) {
    Rng r(11);
  const int64_t H = 64, D = 128, m = 4, K = 512, max_slots = 3, max_entries = 1300;
  // slot 0: a prefill chunk past 5K (1247..1250 causal entries), slot 1: decode at 300 (75 < k entries),
  // slot 2: the first tokens of a prompt (0, 1 or 2 entries).
  BatchRows b({{0, 4990, 10}, {1, 299, 1}, {2, 0, 8}});
  std::vector<float> keys_v, q_v;
  std::vector<uint16_t> keys = rand_bf16(size_t(max_slots * max_entries * D), r, 1.0f, &keys_v);
  std::vector<uint16_t> q = rand_bf16(size_t(b.n() * H * D), r, 1.0f, &q_v);
  std::vector<float> w = rand_f32(size_t(b.n() * H), r, 0.1f, 0.02f);
  cuda::DeviceBuffer dkeys = to_device(keys), dq = to_device(q), dw = to_device(w);
  cuda::DeviceBuffer ds = to_device(b.slot), dp = to_device(b.pos);
  CompressorStateView ks{nullptr, nullptr, dkeys.as<uint16_t>(), max_slots, max_entries, m, 2, D};
  Guarded<float> score(size_t(b.n() * max_entries));
  indexer_scores_cuda(ctx, ks, dq.as<uint16_t>(), dw.as<float>(), H, ds.as<int32_t>(), dp.as<int32_t>(), b.n(),
                      (4999 + 1) / m, score.ptr(), max_entries);
  Guarded<int32_t> idx(size_t(b.n() * K));
  topk_lower_index_first_cuda(ctx, score.ptr(), max_entries, dp.as<int32_t>(), m, b.n(), K, idx.ptr());
  ctx.sync();
  const std::vector<float> gs = score.get(chk_);
  const std::vector<int32_t> gi = idx.get(chk_);
  // The same inputs again: the same bits.
  indexer_scores_cuda(ctx, ks, dq.as<uint16_t>(), dw.as<float>(), H, ds.as<int32_t>(), dp.as<int32_t>(), b.n(),
                      (4999 + 1) / m, score.ptr(), max_entries);
  topk_lower_index_first_cuda(ctx, score.ptr(), max_entries, dp.as<int32_t>(), m, b.n(), K, idx.ptr());
  ctx.sync();
  {
    const std::vector<float> again = score.get(chk_);
    chk_.expect(((0) == (std::memcmp(again.data(), gs.data(), gs.size() * 4))), Msg() << "indexer scores differ between runs");
    chk_.expect(((idx.get(chk_)) == (gi)), Msg() << "top-k differs between runs");
  }
  std::vector<float> g_all, r_all, ref(static_cast<size_t>(max_entries));
  for (int64_t i = 0; i < b.n(); ++i) {
    const int64_t s = b.slot[size_t(i)], cnt = (b.pos[size_t(i)] + 1) / m;
    indexer_scores_cpu(&q_v[size_t(i * H * D)], &keys_v[size_t(s * max_entries * D)], cnt, &w[size_t(i * H)], H, D,
                       ref.data());
    for (int64_t e = 0; e < cnt; ++e) {
      g_all.push_back(gs[size_t(i * max_entries + e)]);
      r_all.push_back(ref[size_t(e)]);
    }
    std::vector<int32_t> want = topk_lower_index_first(&gs[size_t(i * max_entries)], cnt, K);
    want.resize(size_t(K), -1);
    chk_.expect((std::equal(want.begin(), want.end(), gi.begin() + i * K)), Msg() << "top-k of token " << i);
  }
  err(chk_, "indexer scores", "heads=64 dim=128 entries<=1250 tokens=" + std::to_string(b.n()), max_rel(g_all, r_all), 1e-5);
}

void TopkLowerIndexFirstWithTies(cuda::Context& ctx, Checker& chk_) {
    Rng r(12);
  const std::vector<int64_t> ns = {1, 511, 512, 513, 3000, 16384, 70000, 70000, 9000};
  const int64_t ld = 70000;
  std::vector<float> sc(ns.size() * size_t(ld), 0.f);
  std::vector<int32_t> pos(ns.size());
  for (size_t row = 0; row < ns.size(); ++row) {
    pos[row] = int32_t(ns[row] - 1);  // ratio 1: count = pos + 1
    for (int64_t e = 0; e < ns[row]; ++e) {
      float v;
      switch (row % 3) {
        case 0: v = 2.f * r.uniform() - 1.f; break;                      // distinct values
        case 1: v = float(int(r.next() % 4)) * 0.5f - 0.5f; break;       // 4 values: massive ties
        default: v = (r.next() % 3 == 0) ? 0.f : r.uniform(); break;     // many exact zeros (ReLU)
      }
      if (v == 0.f && (r.next() & 1)) v = -0.f;  // −0 ties with +0
      sc[row * size_t(ld) + size_t(e)] = v;
    }
  }
  cuda::DeviceBuffer dsc = to_device(sc), dp = to_device(pos);
  for (int64_t k : {8, 512, 1024, 2048}) {
    Guarded<int32_t> idx(ns.size() * size_t(k));
    topk_lower_index_first_cuda(ctx, dsc.as<float>(), ld, dp.as<int32_t>(), 1, int64_t(ns.size()), k, idx.ptr());
    ctx.sync();
    const std::vector<int32_t> gi = idx.get(chk_);
    for (size_t row = 0; row < ns.size(); ++row) {
      std::vector<int32_t> want = topk_lower_index_first(&sc[row * size_t(ld)], ns[row], k);
      want.resize(size_t(k), -1);
      chk_.expect((std::equal(want.begin(), want.end(), gi.begin() + int64_t(row) * k)), Msg() << "k=" << k << " n=" << ns[row] << " row " << row);
    }
  }
}

// ---------------------------------------------------------------- attention

struct AttnCase {
  int64_t H, D, rope, W;
  int kind;  // 0 window only, 1 HCA (all causal entries), 2 CSA (selected)
  int64_t m, topk;
  std::vector<SlotRun> runs;
  const char* name;
  bool holes = false;  // CSA: −1 entries scattered through each selection (not only after the causal count)
  float q_amp = 3.0f;  // q uniform in ±q_amp: score std ≈ q_amp/3 (30: one entry takes nearly all the weight)
};

// The split path must run for want_split; it runs on the same inputs
// whenever its workspace is not too large for the test (≤ 2^25 floats) and
// must give the in-CTA path's bits. The first token of each run, run alone
// (its window rows are all in the ring or its own), must give its bits in the
// whole batch (batch invariance).
void check_attention(cuda::Context& ctx, Checker& chk_, const AttnCase& ac, uint64_t seed, bool want_split = false) {
  Rng r(seed);
  BatchRows b(ac.runs);
  const int64_t H = ac.H, D = ac.D, W = ac.W, n = b.n();
  int64_t max_slots = 0, max_ctx = 0;
  for (const SlotRun& run : ac.runs) {
    max_slots = std::max<int64_t>(max_slots, run.slot + 1);
    max_ctx = std::max<int64_t>(max_ctx, run.pos0 + run.len);
  }
  const int64_t max_entries = ac.kind ? std::max<int64_t>(1, max_ctx / ac.m) : 0;
  const RopeTable tab = make_rope(ac.rope, ac.kind != 0);
  // Full KV history per slot (bf16 values); the ring holds the rows before each slot's chunk.
  std::vector<std::vector<float>> hist(static_cast<size_t>(max_slots));
  std::vector<std::vector<uint16_t>> hist_b(static_cast<size_t>(max_slots));
  for (const SlotRun& run : ac.runs)
    hist_b[size_t(run.slot)] = rand_bf16(size_t((run.pos0 + run.len) * D), r, 1.0f, &hist[size_t(run.slot)]);
  std::vector<uint16_t> ring(size_t(max_slots * W * D), 0), kv(size_t(n * D));
  for (const SlotRun& run : ac.runs)
    for (int64_t q = std::max<int64_t>(0, run.pos0 - W); q < run.pos0; ++q)
      std::copy_n(&hist_b[size_t(run.slot)][size_t(q * D)], D, &ring[size_t((run.slot * W + q % W) * D)]);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(&hist_b[size_t(b.slot[size_t(i)])][size_t(b.pos[size_t(i)] * D)], D, &kv[size_t(i * D)]);
  std::vector<float> ent_v, q_v;
  std::vector<uint16_t> ent = rand_bf16(size_t(std::max<int64_t>(1, max_slots * max_entries * D)), r, 1.0f, &ent_v);
  std::vector<uint16_t> q = rand_bf16(size_t(n * H * D), r, ac.q_amp, &q_v);
  std::vector<float> sinks = rand_f32(size_t(H), r, 1.0f);
  std::vector<int32_t> sel;
  if (ac.kind == 2) {
    sel.assign(size_t(n * ac.topk), -1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t cnt = std::min<int64_t>((b.pos[size_t(i)] + 1) / ac.m, max_entries);
      std::vector<int32_t> all(static_cast<size_t>(cnt));
      for (int64_t e = 0; e < cnt; ++e) all[size_t(e)] = int32_t(e);
      for (int64_t e = cnt - 1; e > 0; --e) std::swap(all[size_t(e)], all[size_t(r.next() % uint64_t(e + 1))]);
      for (int64_t k = 0; k < std::min(cnt, ac.topk); ++k) sel[size_t(i * ac.topk + k)] = all[size_t(k)];
      if (ac.holes)
        for (int64_t k = 0; k < ac.topk; ++k)
          if (r.next() % 5 == 0) sel[size_t(i * ac.topk + k)] = -1;
    }
  }
  cuda::DeviceBuffer dring = to_device(ring), dkv = to_device(kv), dent = to_device(ent), dq = to_device(q);
  cuda::DeviceBuffer dsinks = to_device(sinks), dsel = to_device(sel), ds = to_device(b.slot), dp = to_device(b.pos);
  cuda::DeviceBuffer dfreq = to_device(tab.freqs);
  AttnInputs in;
  in.kv = dkv.as<uint16_t>();
  in.window = dring.as<uint16_t>();
  in.W = W;
  if (ac.kind) {
    in.entries = dent.as<uint16_t>();
    in.max_entries = max_entries;
    in.ratio = ac.m;
  }
  if (ac.kind == 2) {
    in.sel = dsel.as<int32_t>();
    in.topk = ac.topk;
  }
  in.sinks = dsinks.as<float>();
  RopeView rv{dfreq.as<float>(), ac.rope, 1.0f};
  const float scale = 1.0f / std::sqrt(float(D));
  Guarded<uint16_t> out(size_t(n * H * D)), out2(size_t(n * H * D)), out_split(size_t(n * H * D));
  chk_.expect(!(attention_takes_split(ctx, in, H, D, n)), Msg() << "split without a workspace: " << ac.name);
  attention_sink_cuda(ctx, in, dq.as<uint16_t>(), H, D, scale, rv, ds.as<int32_t>(), dp.as<int32_t>(), n, out.ptr());
  attention_sink_cuda(ctx, in, dq.as<uint16_t>(), H, D, scale, rv, ds.as<int32_t>(), dp.as<int32_t>(), n, out2.ptr());
  // The same inputs with a workspace (starts NaN, canaries around it): the split path when it applies.
  const int64_t max_cand = W + (ac.kind == 2 ? ac.topk : ac.kind == 1 ? max_entries : 0);
  const int64_t ws_floats = attention_split_floats(H, D, max_cand, n);
  const bool try_split = want_split || ws_floats <= (int64_t(1) << 25);
  Guarded<float> ws(size_t(try_split ? ws_floats : 1));
  AttnInputs in_ws = in;
  in_ws.workspace = ws.ptr();
  in_ws.workspace_floats = try_split ? ws_floats : 1;
  const bool split = attention_takes_split(ctx, in_ws, H, D, n);
  if (want_split) {
    chk_.expect((split), Msg() << "the split path does not run: " << ac.name);
    AttnInputs in_short = in_ws;
    in_short.workspace_floats = ws_floats - 1;
    chk_.expect(!(attention_takes_split(ctx, in_short, H, D, n)), Msg() << "split into a workspace too small: " << ac.name);
  }
  if (try_split)
    attention_sink_cuda(ctx, in_ws, dq.as<uint16_t>(), H, D, scale, rv, ds.as<int32_t>(), dp.as<int32_t>(), n,
                        out_split.ptr());
  // The first token of each run alone (before window_store_cuda changes the ring).
  std::vector<int64_t> firsts;
  for (int64_t i = 0, k = 0; k < int64_t(ac.runs.size()); i += ac.runs[size_t(k)].len, ++k) firsts.push_back(i);
  const int64_t nf = int64_t(firsts.size());
  std::vector<int32_t> f_slot, f_pos, f_sel;
  std::vector<uint16_t> f_kv, f_q;
  for (int64_t i : firsts) {
    f_slot.push_back(b.slot[size_t(i)]);
    f_pos.push_back(b.pos[size_t(i)]);
    f_kv.insert(f_kv.end(), kv.begin() + i * D, kv.begin() + (i + 1) * D);
    f_q.insert(f_q.end(), q.begin() + i * H * D, q.begin() + (i + 1) * H * D);
    if (ac.kind == 2) f_sel.insert(f_sel.end(), sel.begin() + i * ac.topk, sel.begin() + (i + 1) * ac.topk);
  }
  cuda::DeviceBuffer dfs = to_device(f_slot), dfp = to_device(f_pos), dfkv = to_device(f_kv), dfq = to_device(f_q);
  cuda::DeviceBuffer dfsel = to_device(f_sel);
  AttnInputs in_f = in;
  in_f.kv = dfkv.as<uint16_t>();
  if (ac.kind == 2) in_f.sel = dfsel.as<int32_t>();
  Guarded<uint16_t> out_f(size_t(nf * H * D));
  attention_sink_cuda(ctx, in_f, dfq.as<uint16_t>(), H, D, scale, rv, dfs.as<int32_t>(), dfp.as<int32_t>(), nf,
                      out_f.ptr());
  window_store_cuda(ctx, dkv.as<uint16_t>(), dring.as<uint16_t>(), W, D, ds.as<int32_t>(), dp.as<int32_t>(), n);
  ctx.sync();
  const std::vector<uint16_t> got_b = out.get(chk_);
  chk_.expect(((got_b) == (out2.get(chk_))), Msg() << "attention is not deterministic: " << ac.name);
  {
    const std::vector<uint16_t> got_f = out_f.get(chk_);
    for (int64_t k = 0; k < nf; ++k)
      chk_.expect((std::equal(got_f.begin() + k * H * D, got_f.begin() + (k + 1) * H * D,
                             got_b.begin() + firsts[size_t(k)] * H * D)), Msg() << "token " << firsts[size_t(k)] << " alone differs from its bits in the batch: " << ac.name);
  }
  if (try_split) {
    chk_.expect((got_b == out_split.get(chk_)), Msg() << (split ? "split" : "in-CTA (with a workspace)")
                                          << " path differs from the in-CTA path: " << ac.name);
    ws.get(chk_);  // its canaries
  }

  std::vector<float> ref(size_t(n * H * D));
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = b.slot[size_t(i)], p = b.pos[size_t(i)];
    std::vector<const float*> ptrs;
    for (int64_t qp = std::max<int64_t>(0, p - W + 1); qp <= p; ++qp) ptrs.push_back(&hist[size_t(s)][size_t(qp * D)]);
    if (ac.kind == 1)
      for (int64_t e = 0; e < std::min((p + 1) / ac.m, max_entries); ++e)
        ptrs.push_back(&ent_v[size_t((s * max_entries + e) * D)]);
    if (ac.kind == 2)
      for (int64_t k = 0; k < ac.topk; ++k)
        if (sel[size_t(i * ac.topk + k)] >= 0)
          ptrs.push_back(&ent_v[size_t((s * max_entries + sel[size_t(i * ac.topk + k)]) * D)]);
    attention_sink_cpu(&q_v[size_t(i * H * D)], ptrs.data(), int64_t(ptrs.size()), sinks.data(), H, D, scale,
                       &ref[size_t(i * H * D)]);
    rope_apply_cpu(&ref[size_t(i * H * D)], H, D, p, tab, true);
  }
  err(chk_, "attention+inv rope", sh(ac.name, n), max_rel(bf16_vals(got_b), ref), 8e-3);

  // The ring now holds, per slot and residue, the latest position's row.
  std::vector<uint16_t> want = ring;
  for (const SlotRun& run : ac.runs)
    for (int64_t qp = std::max<int64_t>(0, run.pos0 + run.len - W); qp < run.pos0 + run.len; ++qp)
      std::copy_n(&hist_b[size_t(run.slot)][size_t(qp * D)], D, &want[size_t((run.slot * W + qp % W) * D)]);
  chk_.expect(((from_device<uint16_t>(dring, want.size())) == (want)), Msg() << "window ring after window_store_cuda: " << ac.name);
}

void AttentionWithSinksFlashShapes(cuda::Context& ctx, Checker& chk_) {
    // V4-Flash CSA: 64 heads × 512, rope 64, window 128, top-512 of > 1000 entries (contexts past 4K), a
  // decode token, a short chunk, and a 151-token prefill (longer than the window).
  check_attention(ctx, chk_, {64, 512, 64, 128, 2, 4, 512, {{0, 4500, 4}, {1, 6000, 1}, {2, 0, 151}}, "Flash CSA"}, 21);
  // V4-Flash HCA: all causal entries of ratio 128 (35 at 4.5K).
  check_attention(ctx, chk_, {64, 512, 64, 128, 1, 128, 0, {{0, 4200, 2}, {1, 4350, 1}, {2, 0, 130}}, "Flash HCA"}, 22);
  // Window-only layer.
  check_attention(ctx, chk_, {64, 512, 64, 128, 0, 0, 0, {{1, 300, 3}, {0, 0, 200}}, "Flash SWA"}, 23);
}

void AttentionWithSinksOtherShapes(cuda::Context& ctx, Checker& chk_) {
    check_attention(ctx, chk_, {128, 512, 64, 128, 2, 4, 1024, {{0, 5000, 2}, {1, 0, 20}}, "Pro 128 heads CSA"}, 31);
  check_attention(ctx, chk_, {4, 32, 8, 12, 2, 4, 4, {{0, 0, 30}, {1, 40, 1}, {2, 7, 5}}, "tiny CSA"}, 32);
  check_attention(ctx, chk_, {4, 32, 8, 12, 1, 16, 0, {{0, 0, 40}, {1, 100, 3}}, "tiny HCA"}, 33);
  check_attention(ctx, chk_, {4, 128, 32, 128, 1, 128, 0, {{0, 0, 300}, {1, 1000, 2}}, "default-model HCA"}, 34);
}

// Shapes the tensor-core segment (a 16-row head tile, k16 steps over the
// channels, 16-channel column pairs over 8 warps) could get wrong: head
// groups of fewer than 16 heads (zero-padded tile rows: 12, 10 of 40, 6,
// 1 of 17, 1), head_dim 16 (one k16 step, one column pair), 32, 64, 128, 256;
// segments past the end and wholly missing (early positions with a large
// top-k), −1 holes; peaked softmax (q ±30); and head_dim 8, which keeps the
// SIMT segment (chosen by the shape). Split where it applies, batch-invariant.
void AttentionHeadGroupsAndDims(cuda::Context& ctx, Checker& chk_) {
    check_attention(ctx, chk_, {12, 64, 16, 40, 2, 4, 48, {{0, 0, 3}, {1, 300, 1}, {2, 90, 2}}, "12 heads x 64 CSA", true}, 51,
                  true);
  check_attention(ctx, chk_, {40, 128, 32, 64, 1, 16, 0, {{0, 0, 70}, {1, 500, 2}}, "40 heads (10 a CTA) x 128 HCA"}, 52);
  check_attention(ctx, chk_, {6, 16, 8, 40, 2, 4, 40, {{0, 0, 25}, {1, 200, 1}}, "6 heads x 16 CSA", true}, 53, true);
  check_attention(ctx, chk_, {10, 32, 8, 70, 1, 8, 0, {{0, 0, 90}, {1, 333, 1}}, "10 heads x 32 HCA"}, 54);
  check_attention(ctx, chk_, {16, 256, 64, 128, 2, 4, 256, {{0, 2000, 3}, {1, 0, 65}}, "16 heads x 256 CSA", true}, 55);
  check_attention(ctx, chk_, {17, 32, 16, 50, 2, 2, 30, {{0, 0, 9}, {1, 120, 1}}, "17 heads (1 a CTA) x 32 CSA"}, 56, true);
  check_attention(ctx, chk_, {1, 64, 16, 30, 1, 8, 0, {{0, 0, 40}, {1, 77, 1}}, "1 head x 64 HCA"}, 57);
  check_attention(ctx, chk_, {64, 512, 64, 128, 2, 4, 512, {{0, 4500, 2}, {1, 0, 70}}, "Flash CSA peaked", true, 30.f}, 58);
  check_attention(ctx, chk_, {64, 512, 64, 128, 2, 4, 512, {{0, 4500, 1}, {1, 3, 1}}, "Flash CSA peaked decode", true, 30.f},
                  59, true);
  // head_dim 8: the SIMT segment, both paths.
  check_attention(ctx, chk_, {4, 8, 8, 12, 2, 4, 70, {{0, 0, 30}, {1, 400, 1}, {2, 7, 5}}, "dim 8 (SIMT) CSA", true}, 60,
                  true);
  check_attention(ctx, chk_, {8, 8, 8, 100, 0, 0, 0, {{0, 0, 150}, {1, 50, 2}}, "dim 8 (SIMT) SWA"}, 61);
}

// Decode-sized batches, where the split path (a CTA per token, head group and
// segment of 64 candidates, then a combine kernel) runs: the same bits as the
// in-CTA path on the same inputs, and the CPU op within tolerance. Tokens at
// position 0 (one candidate), short contexts (selections padded with −1),
// selections with −1 scattered inside, contexts past 4K.
void AttentionSplitMatchesInCta(cuda::Context& ctx, Checker& chk_) {
    // V4-Flash CSA: window 128 + top-512 of > 1000 entries = 10 segments.
  check_attention(ctx, chk_, {64, 512, 64, 128, 2, 4, 512, {{0, 4500, 1}}, "Flash CSA decode"}, 41, true);
  check_attention(ctx, chk_, {64, 512, 64, 128, 2, 4, 512, {{1, 0, 1}, {0, 4600, 1}, {2, 4100, 3}}, "Flash CSA batch"}, 42,
                  true);
  check_attention(ctx, chk_, {64, 512, 64, 128, 2, 4, 512, {{0, 4500, 2}, {2, 700, 1}, {1, 63, 1}}, "Flash CSA holes", true},
                  43, true);
  // V4-Flash HCA: no selection, every causal entry (ratio 128).
  check_attention(ctx, chk_, {64, 512, 64, 128, 1, 128, 0, {{0, 4350, 1}}, "Flash HCA decode"}, 44, true);
  check_attention(ctx, chk_, {64, 512, 64, 128, 1, 128, 0, {{1, 0, 1}, {0, 4200, 2}, {2, 127, 2}}, "Flash HCA batch"}, 45,
                  true);
  // Window only: 128 rows = 2 segments.
  check_attention(ctx, chk_, {64, 512, 64, 128, 0, 0, 0, {{0, 300, 1}, {1, 0, 1}, {2, 64, 1}}, "Flash SWA decode"}, 46,
                  true);
  // 128 heads (8 head groups); an odd small shape: 6 heads of 64, window 40, top-48.
  check_attention(ctx, chk_, {128, 512, 64, 128, 2, 4, 1024, {{0, 5000, 1}, {1, 0, 1}}, "Pro CSA decode"}, 47, true);
  check_attention(ctx, chk_, {6, 64, 16, 40, 2, 4, 48, {{0, 0, 3}, {1, 300, 1}, {2, 90, 2}}, "odd CSA", true}, 48, true);
}


}  // namespace

void add_attention_cases(std::vector<OpCase>& out) {
  const char* kAttnMetric =
      "max|d|/max|ref| (bf16 8e-3, f32 scores 1e-5); exact indices; bits (split vs in-CTA, token alone)";
  add_case(out, check_only_case("attention", "compressor_entries_over_steps", CompressorEntriesOverSteps, kAttnMetric));
  add_case(out, check_only_case("attention", "indexer_scores_and_topk", IndexerScoresAndTopk, kAttnMetric));
  add_case(out, check_only_case("attention", "topk_lower_index_first_with_ties", TopkLowerIndexFirstWithTies, kAttnMetric));
  add_case(out, check_only_case("attention", "sinks_flash_shapes", AttentionWithSinksFlashShapes, kAttnMetric));
  add_case(out, check_only_case("attention", "sinks_other_shapes", AttentionWithSinksOtherShapes, kAttnMetric));
  add_case(out, check_only_case("attention", "head_groups_and_dims", AttentionHeadGroupsAndDims, kAttnMetric));
  add_case(out, check_only_case("attention", "split_matches_in_cta", AttentionSplitMatchesInCta, kAttnMetric));
}

}  // namespace cm::optable
