// DeepSeek-V4 step on the GPU (see cuda_backend.h), in the order of the CPU
// step (model/cpu_backend.cpp):
//
//   X[t, k, :] = embed[token_t]                          k < hc
//   per layer:  a = HCPre_attn(X);  X = HCPost(Attention(RMSNorm(a)), X)
//               f = HCPre_ffn(X);   X = HCPost(MoE(RMSNorm(f), tokens), X)
//   y = RMSNorm(HCHead(X));  logits = y · headᵀ   (rows that ask for logits)
//
// Batch invariance (docs/cuda-backend.md): every kernel computes a row (or a slot's state) from that row
// alone with one fixed arithmetic whatever the batch (FP8/NVFP4 linears: decode kernels below 128 rows,
// prefill kernels with the same sums above; dense weights: kernels whose sums K alone fixes), so a
// sequence's logits are the same bits alone, in any mixed batch and in any chunking — unless
// --fast-prefill sends steps over 256 rows through cuBLAS. Non-finite values: the named intermediates are
// counted per row into a reserved buffer, read only when the logits come back non-finite, to name the
// first intermediate (and slot) that went non-finite, as the CPU backend does.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "common/numeric.h"
#include "comm/comm.h"

namespace cm {

CudaBackend::CudaBackend(const Model& m, const BackendOptions& opt, std::unique_ptr<cuda::DevModel> dm,
                         cuda::OpTimer* timer)
    : m_(m), opt_(opt), obs_(opt.observer), timer_(timer) {
  if (opt.linear_inputs) cuda::throw_error("cuda: the linear-input observer (calibration) runs on the CPU backend only");
  if (opt.act_quant != ActQuant::NONE) cuda::throw_error("cuda: W4A4 emulation runs on the CPU backend only");
  if (opt.kv_cache != KvCache::AUTO)
    cuda::throw_error("cuda: --kv-cache-dtype fp8 is not built for the CUDA backend yet (the CPU backend has it)");
  // Expert parallelism (every rank the same batch, this rank's share of the routed experts): the
  // exchange is a stream-ordered all-reduce, so the communicator must be a device one.
  const int R = opt.ep_comm ? opt.ep_comm->size() : 1, rank = opt.ep_comm ? opt.ep_comm->rank() : 0;
  const int64_t E = m.config.n_routed_experts;
  if (R > 1) {
    CM_CU_CHECK(opt.ep_comm->stream_ordered(),
                "cuda: expert parallelism over %d ranks needs a device communicator (NCCL, or the in-process "
                "DeviceComm); this one has only host collectives",
                R);
    CM_CU_CHECK(!opt.ep_data_parallel,
                "cuda: data-parallel attention with expert parallelism (ep_data_parallel) runs on the CPU backend "
                "only; the CUDA backend runs every rank's batch replicated");
  }
  const int64_t want0 = expert_first(E, rank, R), want1 = expert_first(E, rank + 1, R);
  // The model may hold more than this rank's share (in-process ranks share one whole model); the
  // device gets exactly the share.
  CM_CU_CHECK(dm || (m.weights.experts_first <= want0 && m.weights.experts_end >= want1),
              "cuda: rank %d of %d runs routed experts [%lld, %lld) of %lld but the model holds [%lld, %lld) "
              "(LoadOptions::experts)",
              rank, R, (long long)want0, (long long)want1, (long long)E, (long long)m.weights.experts_first,
              (long long)m.weights.experts_end);
  CM_CU_CHECK(opt.cuda_device >= 0 && opt.cuda_device < cuda::device_count(), "cuda: no CUDA device %d (found %d)",
              opt.cuda_device, cuda::device_count());
  CM_CUDA(cudaSetDevice(opt.cuda_device));  // the weights below go to this device
  // The weights first: a model that does not fit is refused before anything is allocated.
  // A prebuilt device model (the synthetic bench builds it a layer at a time) is taken as is.
  dm_ = dm ? std::move(dm)
           : cuda::upload_model(m, kWorkingBytes, opt.gpu_memory_utilization, ExpertRange{want0, want1 - want0});
  CM_CU_CHECK(dm_->layers.size() == size_t(m.config.num_layers), "cuda: the device model has %zu layers, the config %lld",
              dm_->layers.size(), (long long)m.config.num_layers);
  if (R > 1) {
    CM_CU_CHECK(!dm_->mtp, "cuda: MTP with expert parallelism is not supported yet");
    for (size_t L = 0; L < dm_->layers.size(); ++L) {
      const cuda::DevLayer& l = dm_->layers[L];
      const int64_t f = l.experts ? l.experts->first : l.dense_first;
      const int64_t k = l.experts ? l.experts->count : int64_t(l.dense_experts.size());
      CM_CU_CHECK(f == want0 && k == want1 - want0,
                  "cuda: rank %d of %d: layer %zu holds routed experts [%lld, %lld), not its share [%lld, %lld)", rank,
                  R, L, (long long)f, (long long)(f + k), (long long)want0, (long long)want1);
    }
  }
  // The split-K workspace, and panel scratch only for --fast-prefill (the batch-invariant step never
  // takes the cuBLAS path).
  ctx_ = std::make_unique<Context>(opt.cuda_device, true, opt.batch_invariant ? 0 : cuda::fast_prefill_panel_bytes(*dm_));
  ctx_->set_timer(timer_);  // the step's OpScopes record into it
  if (opt.concurrent_branches) {  // the side stream's ops are not timed: the per-op timer runs without branches
    side_ctx_ = std::make_unique<Context>(opt.cuda_device, true, 0);
    CM_CUDA(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
    CM_CUDA(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
  }
  std::fprintf(stderr, "%s\n", dm_->report.c_str());
}

CudaBackend::~CudaBackend() {
  clear_graphs();
  if (plan_host_) cudaFreeHost(plan_host_);
  if (sample_host_) cudaFreeHost(sample_host_);
  if (draft_host_) cudaFreeHost(draft_host_);
  if (undo_host_) cudaFreeHost(undo_host_);
  if (fork_ev_) cudaEventDestroy(fork_ev_);
  if (join_ev_) cudaEventDestroy(join_ev_);
}

bool CudaBackend::branches(int64_t n) const {
  return side_ctx_ && !obs_.active() && !(timer_ && timer_->mode() == cuda::OpTimer::Mode::OPS) && n <= kGraphMaxRows;
}

void CudaBackend::join_side() {
  if (!side_open_) return;
  side_open_ = false;
  CM_CUDA(cudaEventRecord(join_ev_, side_ctx_->stream()));
  CM_CUDA(cudaStreamWaitEvent(ctx_->stream(), join_ev_, 0));
}

size_t CudaBackend::bytes_per_slot(const CacheShape& shape) const {
  return make_state_layout(m_.config, 1, shape.max_ctx, 2, has_mtp()).bytes_per_slot;
}

void CudaBackend::check_slot(int32_t slot, const char* what) const {
  CM_CU_CHECK(shape_.max_slots >= 1, "%s: the backend has no reserved slots (call reserve first)", what);
  CM_CU_CHECK(slot >= 0 && slot < shape_.max_slots, "%s: slot %d outside [0, %d)", what, slot, shape_.max_slots);
}

int64_t CudaBackend::slot_pos(int32_t slot) const {
  check_slot(slot, "slot_pos");
  return pos_[size_t(slot)];
}

void CudaBackend::reset_slot(int32_t slot) {
  check_slot(slot, "reset_slot");
  pos_[size_t(slot)] = 0;  // no counters on the device: positions say what is valid
  undo_.drop(slot);
}

void CudaBackend::undo_copy(bool to_log) {
  const int64_t n = int64_t(undo_copies_.size());
  if (n == 0) return;
  CM_CU_CHECK(size_t(3 * n) * sizeof(int64_t) <= undo_spans_.size(), "undo: %lld copies exceed the reserved table",
              (long long)n);
  const size_t half = undo_host_entries_ / 2;
  if (!to_log && rollback_used_ + size_t(3 * n) > half) {  // the rollbacks' staging is full: let it drain
    CM_CUDA(cudaStreamSynchronize(ctx_->stream()));
    rollback_used_ = 0;
  }
  // A step's table: its half is free (the last step synchronised); a rollback's: after the ones before it.
  int64_t* host = to_log ? undo_host_ : undo_host_ + half + rollback_used_;
  if (!to_log) rollback_used_ += size_t(3 * n);
  for (int64_t i = 0; i < n; ++i) {
    const UndoCopy& u = undo_copies_[size_t(i)];
    host[3 * i] = int64_t(to_log ? u.log_off : u.state_off);
    host[3 * i + 1] = int64_t(to_log ? u.state_off : u.log_off);
    host[3 * i + 2] = int64_t(u.bytes);
  }
  // (the device table is one: each copy_spans reads it before the next upload, in stream order)
  CM_CUDA(cudaMemcpyAsync(undo_spans_.get(), host, size_t(3 * n) * sizeof(int64_t),
                          cudaMemcpyHostToDevice, ctx_->stream()));
  char* state = static_cast<char*>(state_.get());
  char* log = static_cast<char*>(undo_log_.get());
  cuda::copy_spans(*ctx_, P<int64_t>(undo_spans_), n, to_log ? log : state, to_log ? state : log);
}

void CudaBackend::rollback_slot(int32_t slot, int64_t pos) {
  check_slot(slot, "rollback_slot");
  undo_.book_rollback(slot, pos, pos_[size_t(slot)], undo_copies_);  // throws (cm::Error) changing nothing
  undo_copy(false);
  pos_[size_t(slot)] = pos;
}

std::vector<uint8_t> CudaBackend::slot_state(int32_t slot) const {
  check_slot(slot, "slot_state");
  std::vector<uint8_t> out(layout_.bytes_per_slot);
  size_t at = 0;
  const char* base = static_cast<const char*>(state_.get());
  CM_CUDA(cudaStreamSynchronize(ctx_->stream()));
  for (const StateTensor& t : layout_.tensors) {
    CM_CUDA(cudaMemcpy(out.data() + at, base + t.slot_offset(slot), t.slot_bytes(), cudaMemcpyDeviceToHost));
    at += t.slot_bytes();
  }
  return out;
}

void CudaBackend::copy_slot(int32_t from, int32_t to) {
  check_slot(from, "copy_slot");
  check_slot(to, "copy_slot");
  if (from == to) return;
  undo_.drop(to);
  char* base = static_cast<char*>(state_.get());
  for (const StateTensor& t : layout_.tensors)
    CM_CUDA(cudaMemcpyAsync(base + t.slot_offset(to), base + t.slot_offset(from), t.slot_bytes(),
                            cudaMemcpyDeviceToDevice, ctx_->stream()));
  CM_CUDA(cudaStreamSynchronize(ctx_->stream()));
  pos_[size_t(to)] = pos_[size_t(from)];
}

bool CudaBackend::linear_pair(const char* label, const DevLinear& a, const DevLinear& b, const uint16_t* x_bf,
                              int64_t M, float* ya, float* yb) {
  if (!cuda::run_linear_pair(*ctx_, a, b, x_bf, M, ya, yb)) return false;
  cuda::OpScope op(*ctx_, label);  // (ends at once: the pair's launch is the op)
  return true;
}

void CudaBackend::linear(const DevLinear& w, const void* x, bool x_bf16, int64_t M, void* y, int64_t ldx,
                         int64_t ldy) {
  cuda::OpScope op(*ctx_, op_label(w.name));
  cuda::run_linear(*ctx_, w, x, x_bf16, M, ldx ? ldx : w.K * w.groups, y, false, ldy ? ldy : w.N,
                   P<uint16_t>(act_.cast), opt_.batch_invariant);
}

void CudaBackend::step(const Batch& b, float* logits_out) {
  const Config& c = m_.config;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, V = c.vocab_size, n = b.n, N = shape_.max_step_tokens;
  check_batch(b, shape_, V, pos_.data());
  last_logit_rows_ = 0;  // until this step's logits exist

  // The plan: the batch's rows and the rows whose logits are wanted, one transfer.
  plan_.build(b);
  const int64_t R = plan_.n_logits, max_pos = plan_.max_pos;
  undo_.check(plan_);  // throws (cm::Error) before anything changes
  rollback_used_ = 0;  // the last step synchronised: the rollbacks staged since have been read
  undo_.book_step(plan_, undo_copies_);
  std::copy(b.token, b.token + n, plan_host_);
  std::copy(b.pos, b.pos + n, plan_host_ + N);
  std::copy(b.slot, b.slot + n, plan_host_ + 2 * N);
  std::copy(plan_.logit_rows.begin(), plan_.logit_rows.begin() + R, plan_host_ + 3 * N);
  const int64_t n_mtp = has_mtp() ? mtp_plan(b) : 0;
  n_ = n;
  if (timer_) timer_->begin(ctx.stream());
  {
    cuda::OpScope op(ctx, "plan upload");
    CM_CUDA(cudaMemcpyAsync(act_.plan.get(), plan_host_, size_t((has_mtp() ? 9 : 4) * N) * 4, cudaMemcpyHostToDevice,
                            ctx.stream()));
  }
  if (!undo_copies_.empty()) {  // an undoable step: the rows it writes, to the log first (outside any graph)
    cuda::OpScope op(ctx, "undo log");
    undo_copy(true);
  }
  notes_.clear();
  pending_counts_.count = 0;
  obs_.begin_step();

  // Graphs unless something watches the individual kernels (an observer; the op timer's per-op
  // events — its SPAN mode times the whole step from outside the graph).
  const bool per_op = timer_ && timer_->mode() == cuda::OpTimer::Mode::OPS;
  const bool graph = opt_.cuda_graphs && !obs_.active() && !per_op && n <= kGraphMaxRows;
  if (!graph || !run_graph(n, R, n_mtp)) forward(n, R, max_pos, n_mtp);
  for (const Segment& s : plan_) pos_[size_t(s.slot)] = s.pos0 + s.n;

  // The logits rows to the host (the step's only synchronisation), then the non-finite check.
  if (timer_) timer_->end(ctx.stream());
  last_logit_rows_ = R;
  if (R > 0) {
    float *y = P<float>(act_.final_y), *logits = P<float>(act_.logits);
    obs_.observe(ctx, "final_norm", y, false, {R, D});
    obs_.observe(ctx, "logits", logits, false, {R, V});
    if (!logits_out) {  // the logits stay here for sample_last_step, which checks them
      obs_.flush(ctx);
      return;
    }
    obs_.to_host(ctx, logits_out, logits, size_t(R * V) * 4);
    obs_.flush(ctx);  // before the check: --layer-stats shows where a non-finite value came from
    CM_CU_CHECK(!any_non_finite(logits_out, size_t(R * V)),
                "non-finite logits; the first intermediate that went non-finite is %s (run with --layer-stats for "
                "every layer's statistics)",
                first_non_finite().c_str());
  } else {
    CM_CUDA(cudaStreamSynchronize(ctx.stream()));
    obs_.flush(ctx);
  }
}

void CudaBackend::forward(int64_t n, int64_t R, int64_t max_pos, int64_t n_mtp) {
  const Config& c = m_.config;
  const cuda::DevModel& w = *dm_;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  // Embedding, copied into every hyper-connection stream.
  float* X = P<float>(act_.x);
  join_side();  // a failed step's branch, if one was left open
  {
    cuda::OpScope op(ctx, "embed");
    embed_rows_cuda(ctx, w.embed, d_token_, n, hc, X);
  }
  note("embed", -1, X, false, hc * D, {hc, D});
  flush_counts();  // (layer 0's MoE half rewrites X)
  for (int64_t L = 0; L < c.num_layers; ++L)
    layer_forward(L, n, max_pos, L > 0, L + 1 < c.num_layers ? &w.layers[size_t(L + 1)] : nullptr);
  flush_counts();  // (each layer flushed its own; this covers a model without layers)

  // Final hyper-head and norm (one finishing kernel; the bf16 copy for a quantized head) and the LM
  // head over the rows whose logits are wanted.
  float *part = P<float>(act_.hc_part), *X1 = P<float>(act_.x_alt);
  uint16_t* normed_bf = P<uint16_t>(act_.normed_bf);
  if (R > 0) {
    float *head_in = X1, *y = P<float>(act_.final_y), *logits = P<float>(act_.logits);
    HcHeadParams hp{w.hc_head_fn.p(), w.hc_head_base.p(), w.hc_head_scale.p(), hc, D, c.hc_eps, c.rms_norm_eps};
    {
      cuda::OpScope op(ctx, "hc_head+rms_norm");
      cuda::gather_rows(ctx, X, d_rows_, R, hc * D, head_in);
      hc_head_norm_cuda(ctx, hp, head_in, R, part, HcNormOut{w.norm.p(), c.rms_norm_eps, y, normed_bf});
    }
    linear2(w.head, y, normed_bf, R, logits);
  }
  // The MTP block's rows last: it reads the last layer's streams and reuses the step's scratch.
  if (has_mtp()) mtp_catch_up(n, n_mtp);
}

void CudaBackend::layer_forward(int64_t L, int64_t n, int64_t max_pos, bool partials_ready,
                                const cuda::DevLayer* next) {
  const Config& c = m_.config;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  // Per half layer two mHC kernels: the previous half's hc_post fused with this half's hc_pre partial
  // sums (over the streams it writes, out of place: x → x_alt → x), and hc_pre's finishing kernel fused
  // with the RMSNorm, which also writes the normed rows' bf16 copy for the FP8/NVFP4 linears. The bits
  // are those of hc_post, hc_pre, rms_norm and the casts run apart (ops/hc.h), and every noted buffer
  // holds what it held: X (= act_.x) after each layer, normed after each norm. The two halves read and
  // write their own normed and out, so a layer's intermediates are counted in one launch at its end.
  float *X = P<float>(act_.x), *X1 = P<float>(act_.x_alt), *normed = P<float>(act_.normed), *out = P<float>(act_.out);
  float *normed_ffn = P<float>(act_.normed_ffn), *out_ffn = P<float>(act_.out_ffn);
  float *post = P<float>(act_.post), *comb = P<float>(act_.comb), *part = P<float>(act_.hc_part);
  uint16_t* normed_bf = P<uint16_t>(act_.normed_bf);
  auto norm_out = [&](const cuda::DevF32& w, float* y) { return HcNormOut{w.p(), c.rms_norm_eps, y, normed_bf}; };
  const cuda::DevLayer& lw = dev_layer(L);
  const HcParams attn_hc = hc_params(c, lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale);
  const HcParams ffn_hc = hc_params(c, lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale);
  {
    cuda::OpScope op(ctx, "hc_pre+rms_norm");
    hc_pre_norm_cuda(ctx, attn_hc, X, n, nullptr, post, comb, part, norm_out(lw.attn_norm, normed), partials_ready);
  }
  note("attn_in", L, normed, false, D, {D});
  attention(L, n, max_pos);
  note("attn_out", L, out, false, D, {D});
  {
    cuda::OpScope op(ctx, "hc_post+hc_pre partials");
    hc_post_mix_cuda(ctx, hc, D, out, post, comb, n, X, X1, &ffn_hc, part);
  }
  {
    cuda::OpScope op(ctx, "hc_pre+rms_norm");
    hc_pre_norm_cuda(ctx, ffn_hc, X1, n, nullptr, post, comb, part, norm_out(lw.ffn_norm, normed_ffn), true);
  }
  note("moe_in", L, normed_ffn, false, D, {D});
  moe(L, n);
  note("moe_out", L, out_ffn, false, D, {D});
  {
    // The next layer's hc_pre partial sums with this hc_post (the last layer has none).
    cuda::OpScope op(ctx, next ? "hc_post+hc_pre partials" : "hc_post");
    if (next) {
      const HcParams next_hc = hc_params(c, next->hc_attn_fn, next->hc_attn_base, next->hc_attn_scale);
      hc_post_mix_cuda(ctx, hc, D, out_ffn, post, comb, n, X1, X, &next_hc, part);
    } else {
      hc_post_mix_cuda(ctx, hc, D, out_ffn, post, comb, n, X1, X, nullptr, nullptr);
    }
  }
  note("resid", L, X, false, hc * D, {hc, D});
  flush_counts();
  join_side();  // (each half joined its branch already)
}

void CudaBackend::clear_graphs() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  for (auto& [key, g] : draft_graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  draft_graphs_.clear();
}

cudaGraphExec_t capture_graph(cudaStream_t st, const std::function<void()>& body) {
  CM_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t g = nullptr;
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(st, &g);  // leaves the stream usable; the error is the one thrown
    if (g) cudaGraphDestroy(g);
    throw;
  }
  CM_CUDA(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  CM_CUDA(e);
  return exec;
}

bool CudaBackend::run_graph(int64_t n, int64_t R, int64_t n_mtp) {
  cudaStream_t st = ctx_->stream();
  const int64_t all_pos = shape_.max_ctx - 1;  // the indexer's grid covers every entry the slots can hold
  auto it = graphs_.find({n, R, n_mtp});
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) return false;  // an unusual mix of step shapes
    cudaGraphExec_t exec = capture_graph(st, [&] { forward(n, R, all_pos, n_mtp); });
    it = graphs_.emplace(std::make_tuple(n, R, n_mtp), StepGraph{exec, notes_}).first;
  } else {
    notes_ = it->second.notes;  // what the replayed kernels count, for first_non_finite
  }
  CM_CUDA(cudaGraphLaunch(it->second.exec, st));
  return true;
}

bool cuda_backend_available() { return cuda::device_count() > 0; }

void cuda_use_device(int index) {
  CM_CU_CHECK(index >= 0 && index < cuda::device_count(), "cuda: no CUDA device %d (found %d)", index,
              cuda::device_count());
  CM_CUDA(cudaSetDevice(index));
}

std::unique_ptr<ModelBackend> make_cuda_backend(const Model& m, const BackendOptions& opt) {
  return std::make_unique<CudaBackend>(m, opt);
}

size_t cuda_backend_host_copies(const ModelBackend& be) {
  const auto* cb = dynamic_cast<const CudaBackend*>(&be);
  CM_CU_CHECK(cb, "cuda_backend_host_copies: not a CUDA backend");
  return cb->host_copies();
}

std::unique_ptr<ModelBackend> make_cuda_backend(const Model& m, std::unique_ptr<cuda::DevModel> dm,
                                                cuda::OpTimer* timer, const BackendOptions& opt) {
  return std::make_unique<CudaBackend>(m, opt, std::move(dm), timer);
}

}  // namespace cm
