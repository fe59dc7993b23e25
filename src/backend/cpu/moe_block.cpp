// The MoE block of one layer over a step's rows: router, routed experts, shared expert.
//
//   l = x·gateᵀ (fp32), s = sqrt(softplus(l))
//   hash layers: experts = tid2eid[token];  score layers: top-k of s + bias
//   (ties: lower expert id first); weights w = s_sel / Σ s_sel · routed_scaling
//   expert(x) = w2 · (silu(min(x·w1ᵀ, L)) ⊙ clamp(x·w3ᵀ, −L, L))
//   out = Σ_k w_k expert_k(x) + shared(x)
// Expert ids are global (0 … E−1) throughout. The step's rows are grouped per
// expert so each expert's weights are read once per step; every row adds its
// experts in ascending id order, so its sum does not depend on the batch.
//
// Expert parallelism (BackendOptions::ep_comm, R ranks, every rank the same
// batch): rank r is "home" to rows [r·N/R, (r+1)·N/R) and owns experts
// [r·E/R, (r+1)·E/R). Home rows send each (row, expert) pair to the expert's
// owner (all-to-all), owners run their experts and send y back (all-to-all),
// home adds w·y per row in ascending (expert id, k) order — the single-rank
// order, so the routed sum is bit-identical to one rank — and an all-gather
// gives every rank the whole [N, D] routed sum. A rank may have no home rows
// (N < R) or receive no pairs; it still takes part in every collective.
// Data-parallel attention (ep_data_parallel): each rank steps its own batch,
// every row is home, and nothing is gathered at the end.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "comm/comm.h"
#include "backend/cpu/cpu_backend.h"
#include "ops/router.h"
#include "ops/swiglu.h"

namespace cm {

namespace {

// y = w2 · swiglu(w1·x, w3·x) for n rows of x (g, up: [n, I] scratch).
void expert_forward(CpuBackend& be, const ExpertWeights& e, float limit, const float* x, int64_t n, float* g, float* up,
                    float* y) {
  const int64_t I = e.w1.out_features;
  be.linear(e.w1, x, n, g);
  be.linear(e.w3, x, n, up);
#pragma omp parallel for schedule(static) if (n * I >= (int64_t(1) << 15))
  for (int64_t r = 0; r < n; ++r) swiglu_cpu(g + r * I, up + r * I, I, limit, g + r * I);
  be.linear(e.w2, g, n, y);
}

// Adds row t's routed experts (already grouped) in ascending (expert, k) order:
// o += w_k · y_k, the one accumulation both the 1-rank and the EP paths use.
inline void add_weighted(float* o, float wv, const float* y, int64_t D) {
  for (int64_t d = 0; d < D; ++d) o[d] += wv * y[d];
}

void finish_moe(CpuBackend& be, int64_t L, const float* x, const float* routed, float* out);

// The routed sum over the step's rows under expert parallelism (see the top of the file).
void moe_routed_ep(CpuBackend& be, Comm& comm, int64_t L, const float* x, float* routed) {
  const Config& c = be.model().config;
  const LayerWeights& lw = be.layer_weights(L);
  CpuActivations& a = be.act();
  CpuActivations::Ep& ep = a.ep;
  const int R = comm.size(), me = comm.rank();
  const int64_t N = be.batch().n, D = c.hidden_size, E = c.n_routed_experts, K = c.n_experts_per_tok;
  const bool dp = be.options().ep_data_parallel;  // every row is home (this rank's own batch)
  const int64_t h0 = dp ? 0 : int64_t(me) * N / R, h1 = dp ? N : int64_t(me + 1) * N / R;
  const int64_t e0 = expert_first(E, me, R), e1 = expert_first(E, me + 1, R);

  // Dispatch: home pairs grouped by owner rank (pairs in (t, k) order within a rank).
  std::fill(ep.send_n.begin(), ep.send_n.begin() + R, 0);
  for (int64_t i = h0 * K; i < h1 * K; ++i) ep.send_n[size_t(expert_owner(E, a.eidx[size_t(i)], R))]++;
  std::vector<int64_t>& cur = ep.gather_n;  // reused as fill cursors here
  int64_t off = 0;
  for (int q = 0; q < R; ++q) cur[size_t(q)] = off, off += ep.send_n[size_t(q)];
  for (int64_t i = h0 * K; i < h1 * K; ++i) {
    const int32_t e = a.eidx[size_t(i)];
    const int64_t at = cur[size_t(expert_owner(E, e, R))]++;
    ep.slot_of_pair[size_t(i)] = int32_t(at);
    ep.send_e[size_t(at)] = e;
    std::memcpy(ep.send_x.data() + at * D, x + (i / K) * D, size_t(D) * 4);
  }
  comm.all_to_allv(ep.send_n.data(), ep.ones.data(), ep.recv_n.data(), ep.ones.data());
  int64_t n_recv = 0;
  for (int q = 0; q < R; ++q) n_recv += ep.recv_n[size_t(q)];
  if (n_recv > int64_t(ep.recv_e.size()))
    fail("expert parallelism: rank {} receives {} (row, expert) pairs in layer {}, above the {} it reserved (every "
         "rank must reserve the same max_step_tokens)",
         me, n_recv, L, ep.recv_e.size());
  std::vector<int64_t>&send_f = ep.send_f, &recv_f = ep.recv_f;
  for (int q = 0; q < R; ++q) {
    ep.send_c[size_t(q)] = ep.send_n[size_t(q)], ep.recv_c[size_t(q)] = ep.recv_n[size_t(q)];
    send_f[size_t(q)] = ep.send_c[size_t(q)] * D, recv_f[size_t(q)] = ep.recv_c[size_t(q)] * D;
  }
  comm.all_to_allv(ep.send_e.data(), ep.send_c.data(), ep.recv_e.data(), ep.recv_c.data());
  comm.all_to_allv(ep.send_x.data(), send_f.data(), ep.recv_x.data(), recv_f.data());

  // This rank's experts over the pairs it received (grouped by expert, arrival order within one).
  std::fill(a.ecount.begin(), a.ecount.begin() + E, 0);
  for (int64_t i = 0; i < n_recv; ++i) {
    const int32_t e = ep.recv_e[size_t(i)];
    if (e < e0 || e >= e1) fail("expert parallelism: rank {} received a pair for expert {}, outside its [{}, {})", me, e, e0, e1);
    a.ecount[size_t(e)]++;
  }
  a.estart[size_t(e0)] = 0;
  for (int64_t e = e0; e < e1; ++e) a.estart[size_t(e + 1)] = a.estart[size_t(e)] + a.ecount[size_t(e)];
  std::copy(a.estart.begin() + e0, a.estart.begin() + e1, a.ecount.begin() + e0);
  for (int64_t i = 0; i < n_recv; ++i) ep.recv_pos[size_t(a.ecount[size_t(ep.recv_e[size_t(i)])]++)] = int32_t(i);
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t r0 = a.estart[size_t(e)], n = a.estart[size_t(e + 1)] - r0;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(a.xs.data() + i * D, ep.recv_x.data() + int64_t(ep.recv_pos[size_t(r0 + i)]) * D, size_t(D) * 4);
    expert_forward(be, lw.experts[size_t(e)], c.swiglu_limit, a.xs.data(), n, a.g.data(), a.up.data(), a.y.data());
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(ep.recv_y.data() + int64_t(ep.recv_pos[size_t(r0 + i)]) * D, a.y.data() + i * D, size_t(D) * 4);
  }

  // Combine: results back home, added per row in ascending (expert, k) order.
  comm.all_to_allv(ep.recv_y.data(), recv_f.data(), ep.back_y.data(), send_f.data());
  std::fill(routed + h0 * D, routed + h1 * D, 0.0f);
  for (int64_t t = h0; t < h1; ++t) {
    const int32_t* ids = a.eidx.data() + t * K;
    int32_t prev_e = -1, prev_k = -1;  // the last (expert, k) added
    for (int64_t step = 0; step < K; ++step) {
      int32_t best = -1;
      for (int32_t k = 0; k < K; ++k) {
        const bool after = ids[k] > prev_e || (ids[k] == prev_e && k > prev_k);
        if (after && (best < 0 || ids[k] < ids[best])) best = k;
      }
      prev_e = ids[best], prev_k = best;
      add_weighted(routed + t * D, a.ew[size_t(t * K + best)],
                   ep.back_y.data() + int64_t(ep.slot_of_pair[size_t(t * K + best)]) * D, D);
    }
  }
  if (dp) return;
  for (int q = 0; q < R; ++q) ep.gather_n[size_t(q)] = (int64_t(q + 1) * N / R - int64_t(q) * N / R) * D;
  comm.all_gatherv(routed + h0 * D, ep.gather_n.data(), routed);
}

}  // namespace

void moe_route(const Config& c, const LayerWeights& lw, const int32_t* tokens, const float* logits, int64_t T,
               int32_t* idx, float* weights) {
  RouterParams p;
  p.experts = c.n_routed_experts;
  p.topk = c.n_experts_per_tok;
  p.routed_scaling = float(c.routed_scaling_factor);
  p.bias = lw.gate_bias.empty() ? nullptr : lw.gate_bias.data();
  p.tid2eid = lw.tid2eid.empty() ? nullptr : lw.tid2eid.data();
  p.vocab = c.vocab_size;
  route_cpu(p, tokens, logits, T, idx, weights);
}

void moe_block(CpuBackend& be, int64_t L, const float* x, float* out) {
  const Config& c = be.model().config;
  const LayerWeights& lw = be.layer_weights(L);
  const Batch& b = be.batch();
  CpuActivations& a = be.act();
  const int64_t N = b.n, D = c.hidden_size, E = c.n_routed_experts, K = c.n_experts_per_tok;

  be.linear(lw.gate, x, N, a.router.data());
  be.note("router_logits", L, a.router.data(), E, {E});
  moe_route(c, lw, b.token, a.router.data(), N, a.eidx.data(), a.ew.data());
  float* routed = a.routed.data();
  if (Comm* comm = be.options().ep_comm; comm && comm->size() > 1) {
    moe_routed_ep(be, *comm, L, x, routed);
    finish_moe(be, L, x, routed, out);
    return;
  }

  // Rows grouped by expert (counting sort, rows ascending within an expert).
  std::fill(a.ecount.begin(), a.ecount.begin() + E, 0);
  for (int64_t i = 0; i < N * K; ++i) a.ecount[size_t(a.eidx[size_t(i)])]++;
  a.estart[0] = 0;
  for (int64_t e = 0; e < E; ++e) a.estart[size_t(e + 1)] = a.estart[size_t(e)] + a.ecount[size_t(e)];
  std::copy(a.estart.begin(), a.estart.begin() + E, a.ecount.begin());  // fill cursors
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = a.eidx[size_t(t * K + j)];
      const int32_t at = a.ecount[size_t(e)]++;
      a.erow[size_t(at)] = int32_t(t);
      a.eweight[size_t(at)] = a.ew[size_t(t * K + j)];
    }

  std::fill(routed, routed + N * D, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.estart[size_t(e)], n = a.estart[size_t(e + 1)] - r0;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(a.xs.data() + i * D, x + int64_t(a.erow[size_t(r0 + i)]) * D, size_t(D) * 4);
    expert_forward(be, lw.experts[size_t(e)], c.swiglu_limit, a.xs.data(), n, a.g.data(), a.up.data(), a.y.data());
    for (int64_t i = 0; i < n; ++i) {
      float* o = routed + int64_t(a.erow[size_t(r0 + i)]) * D;
      add_weighted(o, a.eweight[size_t(r0 + i)], a.y.data() + i * D, D);
    }
  }
  finish_moe(be, L, x, routed, out);
}

namespace {

// out = routed + shared expert (every row, every rank).
void finish_moe(CpuBackend& be, int64_t L, const float* x, const float* routed, float* out) {
  const Config& c = be.model().config;
  const LayerWeights& lw = be.layer_weights(L);
  CpuActivations& a = be.act();
  const int64_t N = be.batch().n, D = c.hidden_size;
  be.note("moe_routed", L, routed, D, {D});
  if (lw.has_shared) {
    expert_forward(be, lw.shared, c.swiglu_limit, x, N, a.g.data(), a.up.data(), a.y.data());
    be.note("moe_shared", L, a.y.data(), D, {D});
    for (int64_t i = 0; i < N * D; ++i) out[i] = routed[i] + a.y[size_t(i)];
  } else {
    std::memcpy(out, routed, size_t(N * D) * 4);
  }
}

}  // namespace

}  // namespace cm
