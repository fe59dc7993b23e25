// DeepSeek-V4 step on the CPU, fp32 throughout (spec'd math: see README "Numerics").
//
//   X[t, k, :] = embed[token_t]                          k < hc (hyper-connection streams)
//   per layer:  a = HCPre_attn(X);  X = HCPost(Attention(RMSNorm(a)), X)
//               f = HCPre_ffn(X);   X = HCPost(MoE(RMSNorm(f), tokens), X)
//   y = RMSNorm(HCHead(X));  logits = y · headᵀ   (rows that ask for logits)
//
// The step's rows come from any number of slots; every linear multiplies all
// rows at once, attention/compressor/indexer run per slot over that slot's
// state. Each row's arithmetic is independent of the other rows, so a sequence
// gives the same bits alone and in any batch, and chunked prefill gives the
// same bits as one prefill.
#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/numeric.h"
#include "backend/observe.h"
#include "comm/comm.h"
#include "ops/compressor.h"
#include "ops/hc.h"
#include "ops/norm.h"
#include "backend/step_plan.h"

namespace cm {

namespace {

template <typename T>
void sized(std::vector<T>& v, int64_t n) {
  v.assign(size_t(std::max<int64_t>(n, 1)), T{});
}


HcParams hc_params(const Config& c, const HcWeights& w) {
  return HcParams{w.fn.data(), w.base.data(), w.scale.data(), c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters,
                  c.hc_eps, c.rms_norm_eps};
}

}  // namespace

CpuBackend::CpuBackend(const Model& m, const BackendOptions& opt) : m_(m), opt_(opt) {
  // The routed experts this rank runs must be exactly the ones its model loaded.
  const int64_t E = m.config.n_routed_experts;
  const int R = opt.ep_comm ? opt.ep_comm->size() : 1, r = opt.ep_comm ? opt.ep_comm->rank() : 0;
  const int64_t e0 = expert_first(E, r, R), e1 = expert_first(E, r + 1, R);
  if (m.weights.experts_first != e0 || m.weights.experts_end != e1)
    fail("expert parallelism: rank {} of {} runs routed experts [{}, {}) but its model loaded [{}, {}) (load it with "
         "LoadOptions::experts = {{{}, {}}})",
         r, R, e0, e1, m.weights.experts_first, m.weights.experts_end, e0, e1 - e0);
}

size_t CpuBackend::bytes_per_slot(const CacheShape& shape) const {
  return make_state_layout(m_.config, 1, shape.max_ctx, sizeof(float), has_mtp()).bytes_per_slot;
}

LayerSlot CpuBackend::layer_slot(int32_t s, int64_t L) {
  const LayerStateLayout& ll = layout_.layers[size_t(L)];
  LayerSlot v;
  void* base = state_.data();
  v.window = layout_.at<float>(base, ll.window, s);
  auto comp = [&](const CompressorLayout& cl, CompressorSlot& cs) {
    if (!cl.present()) return;
    cs.pend_kv = layout_.at<float>(base, cl.pend_kv, s);
    cs.pend_gate = layout_.at<float>(base, cl.pend_gate, s);
    cs.entries = layout_.at<float>(base, cl.entries, s);
  };
  comp(ll.comp, v.comp);
  comp(ll.index, v.index);
  return v;
}

void CpuBackend::reserve(const CacheShape& shape) {
  const Config& c = m_.config;
  check_reserve(shape, c);
  // Drop the old reservation first, so resizing does not hold both.
  state_ = {};
  act_ = CpuActivations{};
  shape_ = shape;
  threads_ = omp_get_max_threads();
  layout_ = make_state_layout(c, shape.max_slots, shape.max_ctx, sizeof(float), has_mtp());
  state_.assign((layout_.bytes + sizeof(float) - 1) / sizeof(float), 0.0f);
  pos_.assign(size_t(shape.max_slots), 0);
  undo_.reserve(layout_);
  undo_log_.assign(size_t(shape.max_slots) * undo_.log_bytes_per_slot(), 0);

  const int64_t N = shape.max_step_tokens, D = c.hidden_size, hc = c.hc_mult, H = c.num_heads, hd = c.head_dim;
  const int64_t E = c.n_routed_experts, K = c.n_experts_per_tok, I = c.moe_inter;
  const int64_t ih = c.index_head_dim, inh = c.index_n_heads, W = c.sliding_window;
  CpuActivations& a = act_;
  sized(a.x, N * hc * D);
  sized(a.a, N * D), sized(a.normed, N * D), sized(a.out, N * D);
  sized(a.post, N * hc), sized(a.comb, N * hc * hc);
  sized(a.hc_scratch, int64_t(std::max(hc_pre_scratch_floats(hc, D, N), hc_head_scratch_floats(hc, D, N))));
  sized(a.qr, N * c.q_lora_rank), sized(a.q, N * H * hd), sized(a.kv, N * hd), sized(a.o, N * H * hd);
  sized(a.u, N * c.o_groups * c.o_lora_rank);
  sized(a.ckv, N * 2 * hd), sized(a.cgate, N * 2 * hd);
  sized(a.ikv, N * 2 * ih), sized(a.igate, N * 2 * ih), sized(a.iq, N * inh * ih), sized(a.iw, N * inh);
  sized(a.sel, N * c.index_topk), sized(a.n_sel, N), sized(a.sel_score, N * c.index_topk);
  sized(a.router, N * E), sized(a.eidx, N * K), sized(a.ew, N * K);
  sized(a.ecount, E), sized(a.estart, E + 1), sized(a.erow, N * K), sized(a.eweight, N * K);
  sized(a.routed, N * D), sized(a.head_in, N * hc * D), sized(a.final_y, N * D);
  // Pairs one rank may receive in a step: every pair of the step (replicated batch), or of
  // every rank's batch (data parallel; every rank reserves the same max_step_tokens).
  int64_t max_recv = N * K;
  if (opt_.ep_comm && opt_.ep_comm->size() > 1) {
    const int64_t R = opt_.ep_comm->size();
    if (opt_.ep_data_parallel) max_recv = R * N * K;
    sized(a.ep.send_n, R), sized(a.ep.recv_n, R), sized(a.ep.gather_n, R), sized(a.ep.slot_of_pair, N * K);
    sized(a.ep.send_f, R), sized(a.ep.recv_f, R), a.ep.ones.assign(size_t(R), 1);
    sized(a.ep.send_c, R), sized(a.ep.recv_c, R);
    sized(a.ep.send_x, N * K * D), sized(a.ep.recv_x, max_recv * D), sized(a.ep.send_e, N * K);
    sized(a.ep.recv_e, max_recv), sized(a.ep.recv_y, max_recv * D), sized(a.ep.back_y, N * K * D);
    sized(a.ep.recv_pos, max_recv);
  }
  sized(a.xs, max_recv * D), sized(a.g, std::max(N, max_recv) * I), sized(a.up, std::max(N, max_recv) * I);
  sized(a.y, std::max(N, max_recv) * D);
  int64_t max_m = 1, max_entries = 0, max_ientries = 0;
  for (int64_t L = 0; L < c.num_layers; ++L) {
    const AttnKind k = c.attn_kinds[size_t(L)];
    if (k == AttnKind::SLIDING) continue;
    max_m = std::max(max_m, c.ratio(L));
    max_entries = std::max(max_entries, k == AttnKind::CSA ? c.index_topk : shape.max_ctx / c.ratio(L));
    if (k == AttnKind::CSA) max_ientries = std::max(max_ientries, shape.max_ctx / c.ratio(L));
  }
  if (has_mtp()) {
    sized(a.mtp_in, N * hc * D), sized(a.mtp_x, N * hc * D), sized(a.mtp_e, N * D), sized(a.mtp_hn, N * hc * D);
    sized(a.mtp_tok, N), sized(a.mtp_pos, N), sized(a.mtp_slot, N), a.mtp_want.assign(size_t(N), 1);
    sized(a.draft_save, int64_t(shape.max_slots) * kMaxDraft * hd);
    sized(a.draft_logits, int64_t(shape.max_slots) * c.vocab_size);
    sized(a.draft_status, shape.max_slots), sized(a.draft_lp, shape.max_slots);
  }
  sized(a.pool_kv, 2 * max_m * std::max(hd, ih)), sized(a.pool_gate, 2 * max_m * std::max(hd, ih));
  sized(a.entry, std::max(hd, ih));
  a.threads.assign(size_t(threads_), CpuActivations::Thread{});
  for (auto& t : a.threads) {
    sized(t.ent, W + max_entries);
    sized(t.scores, H * (W + max_entries));
    sized(t.iscore, max_ientries), sized(t.itopk, max_ientries);
    sized(t.iscratch, inh * kIndexerChunk), sized(t.irows, kIndexerChunk);
  }
  plan_.reserve(shape);
  sample_rows_ = sample_rows_for(shape, has_mtp());
  last_logits_.assign(size_t(sample_rows_) * size_t(c.vocab_size), 0.0f);
  last_rows_ = -1;
  sample_status_.assign(size_t(sample_rows_), 0);
  sample_adj_.reserve(size_t(std::min<int64_t>(ModelBackend::kMaxSampleAdjust, int64_t(1) << 16)));
  const int64_t max_k = std::max({D, c.q_lora_rank, H * hd / c.o_groups, c.o_groups * c.o_lora_rank, I});
  linear_cpu_reserve(max_k, max_recv);
}

void CpuBackend::check_slot(int32_t slot, const char* what) const {
  if (pos_.empty()) fail("{}: the backend has no reserved slots (call reserve first)", what);
  if (slot < 0 || slot >= shape_.max_slots) fail("{}: slot {} outside [0, {})", what, slot, shape_.max_slots);
}

int64_t CpuBackend::slot_pos(int32_t slot) const {
  check_slot(slot, "slot_pos");
  return pos_[size_t(slot)];
}

void CpuBackend::reset_slot(int32_t slot) {
  check_slot(slot, "reset_slot");
  pos_[size_t(slot)] = 0;
  undo_.drop(slot);
}

void CpuBackend::rollback_slot(int32_t slot, int64_t pos) {
  check_slot(slot, "rollback_slot");
  undo_.book_rollback(slot, pos, pos_[size_t(slot)], undo_copies_);
  char* base = reinterpret_cast<char*>(state_.data());
  for (const UndoCopy& c : undo_copies_) std::memcpy(base + c.state_off, undo_log_.data() + c.log_off, c.bytes);
  pos_[size_t(slot)] = pos;
}

std::vector<uint8_t> CpuBackend::slot_state(int32_t slot) const {
  check_slot(slot, "slot_state");
  std::vector<uint8_t> out;
  const char* base = reinterpret_cast<const char*>(state_.data());
  for (const StateTensor& t : layout_.tensors)
    out.insert(out.end(), base + t.slot_offset(slot), base + t.slot_offset(slot) + t.slot_bytes());
  return out;
}

void CpuBackend::copy_slot(int32_t from, int32_t to) {
  check_slot(from, "copy_slot");
  check_slot(to, "copy_slot");
  if (from == to) return;
  undo_.drop(to);
  char* base = reinterpret_cast<char*>(state_.data());
  for (const StateTensor& t : layout_.tensors)
    std::memcpy(base + t.slot_offset(to), base + t.slot_offset(from), t.slot_bytes());
  pos_[size_t(to)] = pos_[size_t(from)];
}

void CpuBackend::linear(const LinearWeight& w, const float* x, int64_t m, float* y, int64_t ldx, int64_t ldy,
                        int64_t row0, int64_t rows) {
  if (rows < 0) rows = w.out_features - row0;
  if (ldx == 0) ldx = w.in_features;
  if (ldy == 0) ldy = rows;
  if (opt_.linear_inputs) opt_.linear_inputs->observe_input(w, x, m, ldx);
  linear_cpu_rows(w, row0, rows, x, ldx, m, y, ldy, opt_.act_quant);
}

void CpuBackend::note_slot(const char* what, int64_t layer, const Segment& s, const float* data, int64_t rows,
                           int64_t row_width, std::initializer_list<int64_t> inner) {
  const bool bad = first_bad_.empty() && any_non_finite(data, size_t(rows * row_width));
  if (!opt_.observer && !bad) return;
  std::string name = layer >= 0 ? fmt::format("l{}.s{}.{}", layer, s.slot, what) : fmt::format("s{}.{}", s.slot, what);
  if (bad) first_bad_ = name;
  if (!opt_.observer) return;
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), inner.begin(), inner.end());
  observe_host(*opt_.observer, name, data, shape);
}

void CpuBackend::note(const char* what, int64_t layer, const float* data, int64_t row_width,
                      std::initializer_list<int64_t> inner) {
  // One scan of the whole step first: the common case (no observer, all finite) costs one pass.
  if (!opt_.observer && !(first_bad_.empty() && any_non_finite(data, size_t(batch_->n * row_width)))) return;
  for (const Segment& s : plan_) note_slot(what, layer, s, data + s.row0 * row_width, s.n, row_width, inner);
}

void CpuBackend::layer_forward(int64_t L, float* X, int64_t N) {
  const Config& c = m_.config;
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  const LayerWeights& lw = layer_weights(L);
  CpuActivations& a = act_;
  float *A = a.a.data(), *normed = a.normed.data(), *out = a.out.data();
  hc_pre_cpu(hc_params(c, lw.hc_attn), X, N, A, a.post.data(), a.comb.data(), a.hc_scratch.data());
  rms_norm_cpu(A, lw.attn_norm.data(), N, D, c.rms_norm_eps, normed);
  note("attn_in", L, normed, D, {D});
  attention_block(*this, L, normed, out);
  note("attn_out", L, out, D, {D});
  hc_post_cpu(hc, D, out, a.post.data(), a.comb.data(), N, X);

  hc_pre_cpu(hc_params(c, lw.hc_ffn), X, N, A, a.post.data(), a.comb.data(), a.hc_scratch.data());
  rms_norm_cpu(A, lw.ffn_norm.data(), N, D, c.rms_norm_eps, normed);
  note("moe_in", L, normed, D, {D});
  moe_block(*this, L, normed, out);
  note("moe_out", L, out, D, {D});
  hc_post_cpu(hc, D, out, a.post.data(), a.comb.data(), N, X);
  note("resid", L, X, hc * D, {hc, D});
}

void CpuBackend::step(const Batch& b, float* logits_out) {
  const Config& c = m_.config;
  const Weights& w = m_.weights;
  const int64_t D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size, N = b.n;
  last_rows_ = -1;  // nothing to sample until this step has its logits
  last_out_ = nullptr;
  check_batch(b, shape_, V, pos_.data());
  batch_ = &b;
  first_bad_.clear();
  CpuActivations& a = act_;

  plan_.build(b);  // the batch as runs of one slot each
  if (!logits_out && plan_.n_logits > sample_rows_) {
    batch_ = nullptr;
    fail("step: {} rows with logits to keep for sample_last_step, more than the {} reserved (max_sample_rows)",
         plan_.n_logits, sample_rows_);
  }
  try {
    undo_.check(plan_);
  } catch (...) {
    batch_ = nullptr;
    throw;
  }
  undo_.book_step(plan_, undo_copies_);
  {
    const char* base = reinterpret_cast<const char*>(state_.data());
    for (const UndoCopy& c : undo_copies_) std::memcpy(undo_log_.data() + c.log_off, base + c.state_off, c.bytes);
  }

  // Embedding, copied into every hyper-connection stream.
  float* X = a.x.data();
#pragma omp parallel for schedule(static) if (N * hc * D >= (int64_t(1) << 16))
  for (int64_t t = 0; t < N; ++t) {
    linear_expand_row(w.embed, b.token[t], X + t * hc * D);
    for (int64_t k = 1; k < hc; ++k) std::memcpy(X + (t * hc + k) * D, X + t * hc * D, size_t(D) * 4);
  }
  note("embed", -1, X, hc * D, {hc, D});

  for (int64_t L = 0; L < c.num_layers; ++L) layer_forward(L, X, N);
  if (has_mtp()) mtp_catch_up(b);
  for (const Segment& s : plan_) pos_[size_t(s.slot)] = s.pos0 + s.n;

  // Final hyper-head, norm and LM head over the rows whose logits are wanted.
  const int64_t R = plan_.n_logits;
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(a.head_in.data() + i * hc * D, X + int64_t(plan_.logit_rows[size_t(i)]) * hc * D, size_t(hc * D) * 4);
  if (R > 0) {
    HcHeadParams hp{w.hc_head_fn.data(), w.hc_head_base.data(), w.hc_head_scale.data(), hc, D, c.hc_eps,
                    c.rms_norm_eps};
    float* y = a.final_y.data();
    hc_head_cpu(hp, a.head_in.data(), R, y, a.hc_scratch.data());
    rms_norm_cpu(y, w.norm.data(), R, D, c.rms_norm_eps, y);
    float* out = logits_out ? logits_out : last_logits_.data();
    linear(w.head, y, R, out);
    if (opt_.observer) {
      observe_host(*opt_.observer, "final_norm", y, {R, D});
      observe_host(*opt_.observer, "logits", out, {R, V});
    }
    if (!logits_out) {  // checked when sampled (the seam's contract for logits kept by the backend)
      last_rows_ = R;
      batch_ = nullptr;
      return;
    }
    if (any_non_finite(logits_out, size_t(R * V)))
      fail("non-finite logits; the first intermediate that went non-finite is {} (run with --layer-stats for "
           "every layer's statistics)",
           first_bad_.empty() ? std::string("the LM head") : first_bad_);
  }
  // sample_last_step may still draw from the rows returned (copied then: the sampler adjusts in place).
  last_rows_ = R <= sample_rows_ ? R : -1;
  last_out_ = logits_out;
  batch_ = nullptr;
}

void CpuBackend::sample_last_step(const StepSampling& s) {
  CM_CHECK(last_rows_ >= 0, "sample_last_step: no step with at most {} logits rows to sample (one draw per step)",
           sample_rows_);
  const int64_t R = last_rows_, V = m_.config.vocab_size;
  if (last_out_) std::memcpy(last_logits_.data(), last_out_, size_t(R * V) * sizeof(float));
  CM_CHECK(s.params && s.token && s.logprob && (!s.adj || s.adj_offsets),
           "sample_last_step: params, token and logprob are required (adj with its offsets)");
  SampleArgs a;
  a.logits = last_logits_.data();
  a.rows = R;
  a.vocab = V;
  a.params = s.params;
  if (s.adj) {
    CM_CHECK(s.adj_offsets[R] <= ModelBackend::kMaxSampleAdjust, "sample_last_step: {} adjustments, more than {}",
             s.adj_offsets[R], ModelBackend::kMaxSampleAdjust);
    sample_adj_.assign(s.adj, s.adj + s.adj_offsets[R]);
    a.adj = sample_adj_.data();
    a.adj_offsets = s.adj_offsets;
  }
  a.mask = s.mask;
  a.mask_words = s.mask_words;
  a.token = s.token;
  a.logprob = s.logprob;
  a.status = sample_status_.data();
  a.top_n = s.top_n;
  a.top_id = s.top_id;
  a.top_logprob = s.top_logprob;
  last_rows_ = -1;  // the rows are adjusted in place: one draw per step
  sample_rows_cpu(a);
  for (int64_t r = 0; r < R; ++r) {
    if (sample_status_[size_t(r)] == kSampleNonFinite)
      fail("non-finite logits; the first intermediate that went non-finite is {} (run with --layer-stats for "
           "every layer's statistics)",
           first_bad_.empty() ? std::string("the LM head") : first_bad_);
    if (sample_status_[size_t(r)] != kSampleOk) fail("sampling: row {}: every token is banned or masked", r);
  }
}

std::unique_ptr<ModelBackend> make_cpu_backend(const Model& m, const BackendOptions& opt) {
  return std::make_unique<CpuBackend>(m, opt);
}

}  // namespace cm
