// The MTP block on the GPU (DeepSeek-V4's next-token prediction layer, mtp.0.*): drafts for
// speculative decoding, the same block and state as the CPU backend's (backend/cpu/mtp_block.cpp):
//
//   X_in[t, k] = e_proj(enorm(embed[token t+1])) + h_proj(hnorm(X[t, k]))   (X: the last layer's streams at t)
//   X_out      = Block(X_in)            a sliding-window, score-routed layer (layer id num_layers)
//   logits     = head(norm(HCHead_mtp(X_out)))                              (predicts token t+2)
//
// Each step, after the LM head and inside the step's graph, feeds the block the positions its tokens
// complete (a run's previous position, whose last-layer streams the hidden ring kept, and every row but
// the last) and writes only their window rows (the K=V row: no attention, no experts), then keeps each
// run's last rows in the hidden ring. mtp_plan lays those rows out on the host with the step's plan, so
// the whole of it is one upload.
//
// draft() runs the whole block k times, one row per slot each time, all of it one graph captured per
// (rows, passes): a pass reads its rows' tokens, positions and input streams from fixed device arrays,
// samples its logits on the device into the next pass's tokens (each row's draw counter one further),
// and mtp_advance records the tokens and moves the positions on. The window rows the passes write are
// saved before and put back after (copy_spans), so drafts leave no trace. One upload (pinned) brings
// the rows, one download the k·n tokens and their statuses: a draft synchronises once.
#include <algorithm>
#include <cstring>

#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "common/error.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/norm.h"

namespace cm {

CudaBackend::DraftStage CudaBackend::draft_stage(int64_t S, int64_t hd) {
  DraftStage s;
  cuda::StagePacker pk;
  // Uploaded together: params .. spans; downloaded together: out, out_status.
  s.params = pk.take(size_t(S) * sizeof(SampleParams));
  s.tok = pk.take(size_t(S) * 4);
  s.pos = pk.take(size_t(S) * 4);
  s.slot = pk.take(size_t(S) * 4);
  s.src = pk.take(size_t(S) * 4);
  s.status = pk.take(size_t(S) * 4);
  s.lp = pk.take(size_t(S) * 4);
  s.pass = pk.take(4);
  s.spans = pk.take(size_t(2 * kMaxDraft * S) * 3 * 8);
  s.out = pk.take(size_t(kMaxDraft * S) * 4);
  s.out_status = pk.take(size_t(kMaxDraft * S) * 4);
  s.save = pk.take(size_t(kMaxDraft * S * hd) * 2);
  s.bytes = pk.at;
  return s;
}

int64_t CudaBackend::mtp_plan(const Batch& b) {
  const int64_t N = shape_.max_step_tokens, hrows = layout_.tensors[size_t(layout_.hidden)].rows;
  int32_t *tok = plan_host_ + 4 * N, *pos = tok + N, *slot = pos + N, *src = slot + N, *dst = src + N;
  // The rows: per run, positions [pos0 − 1, pos0 + n − 1) (from 0), each with the token after it; the
  // streams of pos0 − 1 come from the hidden ring (row −1 − its ring row), the others from the step.
  int64_t k = 0;
  for (const Segment& s : plan_)
    for (int64_t t = std::max<int64_t>(s.pos0 - 1, 0); t < s.pos0 + s.n - 1; ++t, ++k) {
      tok[k] = b.token[s.row0 + (t + 1 - s.pos0)];
      pos[k] = int32_t(t);
      slot[k] = s.slot;
      src[k] = t < s.pos0 ? int32_t(-1 - (int64_t(s.slot) * hrows + t % hrows)) : int32_t(s.row0 + t - s.pos0);
    }
  // The hidden ring keeps each run's last rows (the ring row of pos0 − 1 is read before it is written).
  for (const Segment& s : plan_)
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t q = s.pos0 + i;
      dst[s.row0 + i] = q >= s.pos0 + s.n - hrows ? int32_t(int64_t(s.slot) * hrows + q % hrows) : -1;
    }
  return k;
}

void CudaBackend::mtp_input(int64_t n, const int32_t* tok, const float* streams, float* x_in) {
  const Config& c = m_.config;
  const cuda::DevMtp& mw = *dm_->mtp;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  const float eps = c.rms_norm_eps;
  float *emb = P<float>(act_.mtp_emb), *e = P<float>(act_.mtp_e);
  uint16_t* bf = P<uint16_t>(act_.mtp_bf);
  float* hn = const_cast<float*>(streams);  // normed in place: the block reads its input streams once
  {
    cuda::OpScope op(ctx, "mtp embed+enorm");
    embed_rows_cuda(ctx, dm_->embed, tok, n, 1, emb);
    rms_norm_cuda(ctx, emb, mw.enorm.p(), n, D, eps, emb, false, nullptr, nullptr, 1, bf);
  }
  linear2(mw.e_proj, emb, bf, n, e);
  {
    cuda::OpScope op(ctx, "mtp hnorm");
    rms_norm_cuda(ctx, hn, mw.hnorm.p(), n * hc, D, eps, hn, false, nullptr, nullptr, 1, bf);
  }
  linear2(mw.h_proj, hn, bf, n * hc, x_in);
  {
    cuda::OpScope op(ctx, "mtp add");
    cuda::add_to_streams(ctx, e, n, hc, D, x_in);
  }
}

void CudaBackend::mtp_catch_up(int64_t n, int64_t n_mtp) {
  const Config& c = m_.config;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, hc = c.hc_mult, hd = c.head_dim, Lm = c.num_layers;
  const float eps = c.rms_norm_eps;
  float *X = P<float>(act_.x), *xs = P<float>(act_.mtp_x);
  float* ring = layout_.at<float>(state_.get(), layout_.hidden, 0);
  {
    cuda::OpScope op(ctx, "mtp rows");
    cuda::mtp_gather_rows(ctx, X, ring, d_msrc_, n_mtp, hc * D, xs);
    cuda::scatter_rows(ctx, X, d_rdst_, n, hc * D, ring);
  }
  if (n_mtp == 0) return;
  // x_in into x_alt (free after the head), so X keeps the last layer's streams for any observer.
  float* xin = P<float>(act_.x_alt);
  mtp_input(n_mtp, d_mtok_, xs, xin);
  const cuda::DevLayer& lw = dm_->mtp->block;
  float *normed = P<float>(act_.normed), *kvf = P<float>(act_.kvf);
  uint16_t *normed_bf = P<uint16_t>(act_.normed_bf), *kv = P<uint16_t>(act_.kv_bf);
  {
    cuda::OpScope op(ctx, "mtp hc_pre+rms_norm");
    hc_pre_norm_cuda(ctx, hc_params(c, lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale), xin, n_mtp, nullptr,
                     P<float>(act_.post), P<float>(act_.comb), P<float>(act_.hc_part),
                     HcNormOut{lw.attn_norm.p(), eps, normed, normed_bf}, false);
  }
  linear2(lw.wkv, normed, normed_bf, n_mtp, kvf);
  {
    cuda::OpScope op(ctx, "mtp kv norm+rope, window_store");
    rms_norm_cuda(ctx, kvf, lw.kv_norm.p(), n_mtp, hd, eps, kv, true, &dm_->rope_main, d_mpos_, 1);
    window_store_cuda(ctx, kv, layers_[size_t(Lm)].window, c.sliding_window, hd, d_mslot_, d_mpos_, n_mtp);
  }
}

void CudaBackend::draft_pass(int64_t n) {
  const Config& c = m_.config;
  const cuda::DevMtp& mw = *dm_->mtp;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  const DraftStage& st = draft_;
  char* d = P<char>(act_.draft);
  int32_t* tok = reinterpret_cast<int32_t*>(d + st.tok);
  float *X = P<float>(act_.x), *xs = P<float>(act_.mtp_x);
  mtp_input(n, tok, xs, X);
  layer_forward(c.num_layers, n, shape_.max_ctx - 1, false, nullptr);
  CM_CUDA(cudaMemcpyAsync(xs, X, size_t(n * hc * D) * 4, cudaMemcpyDeviceToDevice, ctx.stream()));  // the next pass's
  float *y = P<float>(act_.final_y), *logits = P<float>(act_.logits);
  uint16_t* normed_bf = P<uint16_t>(act_.normed_bf);
  HcHeadParams hp{mw.hc_head_fn.p(), mw.hc_head_base.p(), mw.hc_head_scale.p(), hc, D, c.hc_eps, c.rms_norm_eps};
  {
    cuda::OpScope op(ctx, "mtp hc_head+rms_norm");
    hc_head_norm_cuda(ctx, hp, X, n, P<float>(act_.hc_part), HcNormOut{mw.norm.p(), c.rms_norm_eps, y, normed_bf});
  }
  linear2(dm_->head, y, normed_bf, n, logits);
  SampleArgs a;
  a.logits = logits;
  a.rows = n;
  a.vocab = c.vocab_size;
  a.params = reinterpret_cast<const SampleParams*>(d + st.params);
  a.token = tok;  // the next pass's input
  a.logprob = reinterpret_cast<float*>(d + st.lp);
  a.status = reinterpret_cast<int32_t*>(d + st.status);
  {
    cuda::OpScope op(ctx, "mtp sample");
    sample_rows_cuda(ctx, a);
    cuda::mtp_advance(ctx, tok, a.status, n, d + st.params, reinterpret_cast<int32_t*>(d + st.pos),
                      reinterpret_cast<int32_t*>(d + st.out), reinterpret_cast<int32_t*>(d + st.out_status),
                      reinterpret_cast<int32_t*>(d + st.pass));
  }
}

void CudaBackend::draft(const DraftRequest& r) {
  const Config& c = m_.config;
  const int64_t hd = c.head_dim, W = c.sliding_window, V = c.vocab_size;
  const int64_t Lm = c.num_layers, n = r.n, k = r.k;
  if (!has_mtp()) fail("draft: the model was loaded without its MTP block (load it with the MTP weights)");
  if (!samples_on_device())
    fail("draft: a vocabulary of {} ids exceeds the device sampler's {}", V, sample_rows_cuda_max_vocab());
  check_draft(r, shape_, V, pos_.data());
  Context& ctx = *ctx_;
  const DraftStage& st = draft_;
  char *h = draft_host_, *d = P<char>(act_.draft);
  const int64_t hrows = layout_.tensors[size_t(layout_.hidden)].rows;
  const StateTensor& win = layout_.tensors[size_t(layout_.layers[size_t(Lm)].window)];
  auto* params = reinterpret_cast<SampleParams*>(h + st.params);
  auto *tok = reinterpret_cast<int32_t*>(h + st.tok), *pos = reinterpret_cast<int32_t*>(h + st.pos);
  auto *slot = reinterpret_cast<int32_t*>(h + st.slot), *src = reinterpret_cast<int32_t*>(h + st.src);
  auto* spans = reinterpret_cast<int64_t*>(h + st.spans);
  const int64_t n_spans = n * k;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = r.slot[i];
    const int64_t p = pos_[size_t(s)] - 1;
    params[i] = r.params ? r.params[i] : SampleParams{};
    tok[i] = r.token[i], pos[i] = int32_t(p), slot[i] = s;
    src[i] = int32_t(-1 - (int64_t(s) * hrows + p % hrows));
    // The window rows the k passes write: saved (table 0: save ← state), put back (table 1).
    for (int64_t j = 0; j < k; ++j) {
      const int64_t save = (i * kMaxDraft + j) * hd * 2, state = int64_t(win.slot_offset(s)) + ((p + j) % W) * hd * 2;
      int64_t* a = spans + 3 * (i * k + j);
      int64_t* b = spans + 3 * (n_spans + i * k + j);
      a[0] = save, a[1] = state, a[2] = hd * 2;
      b[0] = state, b[1] = save, b[2] = hd * 2;
    }
  }
  *reinterpret_cast<int32_t*>(h + st.pass) = 0;
  // The table of puts-back right after the saves': one upload of [params, the tables' end).
  CM_CUDA(cudaMemcpyAsync(d, h, st.spans + size_t(2 * n_spans) * 3 * 8, cudaMemcpyHostToDevice, ctx.stream()));
  // The passes' rows as a plan (the names of their intermediates, first_non_finite).
  std::vector<uint8_t> want(size_t(n), 1);
  const Batch pb{int32_t(n), tok, pos, slot, want.data()};
  plan_.build(pb);
  n_ = n;
  last_logit_rows_ = 0;  // the logits a draft makes are its own
  notes_.clear();
  pending_counts_.count = 0;
  obs_.begin_step();
  const int32_t *keep_tok = d_token_, *keep_pos = d_pos_, *keep_slot = d_slot_;
  // The block's kernels read the passes' rows (route reads tokens, attention positions and slots).
  d_token_ = reinterpret_cast<const int32_t*>(d + st.tok);
  d_pos_ = reinterpret_cast<const int32_t*>(d + st.pos);
  d_slot_ = reinterpret_cast<const int32_t*>(d + st.slot);
  // The saves outside any graph: whatever fails after them (a capture, a kernel), the rows can go back.
  cuda::copy_spans(ctx, reinterpret_cast<const int64_t*>(d + st.spans), n_spans, d + st.save,
                   static_cast<char*>(state_.get()));
  try {
    const bool per_op = timer_ && timer_->mode() == cuda::OpTimer::Mode::OPS;
    const bool graph = opt_.cuda_graphs && !obs_.active() && !per_op && n <= kGraphMaxRows;
    if (!graph || !run_draft_graph(n, k)) draft_body(n, k, n_spans);
  } catch (...) {
    d_token_ = keep_tok, d_pos_ = keep_pos, d_slot_ = keep_slot;
    // Whatever ran, the saved rows go back.
    cuda::copy_spans(ctx, reinterpret_cast<const int64_t*>(d + st.spans) + 3 * n_spans, n_spans,
                     static_cast<char*>(state_.get()), d + st.save);
    throw;
  }
  d_token_ = keep_tok, d_pos_ = keep_pos, d_slot_ = keep_slot;
  CM_CUDA(cudaMemcpyAsync(h + st.out, d + st.out, st.save - st.out, cudaMemcpyDeviceToHost, ctx.stream()));
  CM_CUDA(cudaStreamSynchronize(ctx.stream()));
  obs_.flush(ctx);
  const int32_t *out = reinterpret_cast<const int32_t*>(h + st.out),
                *status = reinterpret_cast<const int32_t*>(h + st.out_status);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = 0; i < n; ++i) {
      if (status[j * n + i] != kSampleOk)
        fail("draft: slot {}: non-finite MTP logits (the first intermediate that went non-finite is {})", r.slot[i],
             first_non_finite());
      r.out[i * k + j] = out[j * n + i];
    }
}

void CudaBackend::draft_body(int64_t n, int64_t k, int64_t n_spans) {
  Context& ctx = *ctx_;
  const DraftStage& st = draft_;
  char *d = P<char>(act_.draft), *state = static_cast<char*>(state_.get());
  const int64_t* spans = reinterpret_cast<const int64_t*>(d + st.spans);
  const int64_t width = m_.config.hc_mult * m_.config.hidden_size;
  {
    cuda::OpScope op(ctx, "mtp rows");
    cuda::mtp_gather_rows(ctx, nullptr, layout_.at<float>(state_.get(), layout_.hidden, 0),
                          reinterpret_cast<const int32_t*>(d + st.src), n, width, P<float>(act_.mtp_x));
  }
  for (int64_t j = 0; j < k; ++j) draft_pass(n);
  {
    cuda::OpScope op(ctx, "mtp put back");
    cuda::copy_spans(ctx, spans + 3 * n_spans, n_spans, state, d + st.save);
  }
}

bool CudaBackend::run_draft_graph(int64_t n, int64_t k) {
  cudaStream_t st = ctx_->stream();
  auto it = draft_graphs_.find({n, k});
  if (it == draft_graphs_.end()) {
    if (draft_graphs_.size() >= kMaxGraphs) return false;
    cudaGraphExec_t exec = capture_graph(st, [&] { draft_body(n, k, n * k); });
    it = draft_graphs_.emplace(std::make_pair(n, k), StepGraph{exec, notes_}).first;
  } else {
    notes_ = it->second.notes;
  }
  CM_CUDA(cudaGraphLaunch(it->second.exec, st));
  return true;
}

}  // namespace cm
