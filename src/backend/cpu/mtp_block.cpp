// The MTP block on the CPU (DeepSeek-V4's next-token prediction layer, mtp.0.*): drafts for
// speculative decoding.
//
//   X_in[t, k] = e_proj(enorm(embed[token t+1])) + h_proj(hnorm(X[t, k]))   (X: the last layer's streams at t)
//   X_out      = Block(X_in)            a sliding-window, score-routed layer (layer id num_layers)
//   logits     = head(norm(HCHead_mtp(X_out)))                              (predicts token t+2)
//
// Its only state is its window: the block's K=V row of position t, which needs the token of t + 1. So
// each step, after the model's layers, feeds the block the positions its tokens complete (the slot's
// previous position, whose last-layer streams the hidden ring kept, and every row but the last), and
// writes only those window rows (no attention, no experts: nothing else of the block persists). The
// hidden ring keeps the last layer's streams of the slot's last positions for the next step and for
// draft(). draft() runs the whole block k times, one row per slot each time (the first from the slot's
// last position and its next token, then on its own output and the token it just drew), and puts back
// the window rows it wrote: drafts leave no trace, and the rows of true tokens are the steps' to write.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "comm/comm.h"
#include "common/error.h"
#include "ops/hc.h"
#include "ops/norm.h"

namespace cm {

float* CpuBackend::hidden_row(int32_t slot, int64_t p) {
  const StateTensor& t = layout_.tensors[size_t(layout_.hidden)];
  return layout_.at<float>(state_.data(), layout_.hidden, slot) + (p % t.rows) * t.width;
}

void mtp_input(CpuBackend& be, const int32_t* tok, const float* X, int64_t n, float* xin) {
  const Config& c = be.model().config;
  const MtpWeights& mw = be.model().weights.mtp[0];
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  CpuActivations& a = be.act();
  float *e = a.mtp_e.data(), *hn = a.mtp_hn.data();
  for (int64_t t = 0; t < n; ++t) linear_expand_row(be.model().weights.embed, tok[t], a.out.data() + t * D);
  rms_norm_cpu(a.out.data(), mw.enorm.data(), n, D, c.rms_norm_eps, a.out.data());
  be.linear(mw.e_proj, a.out.data(), n, e);
  rms_norm_cpu(X, mw.hnorm.data(), n * hc, D, c.rms_norm_eps, hn);
  be.linear(mw.h_proj, hn, n * hc, xin);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < hc; ++k) {
      float* r = xin + (t * hc + k) * D;
      for (int64_t d = 0; d < D; ++d) r[d] = e[t * D + d] + r[d];
    }
}

void CpuBackend::mtp_catch_up(const Batch& b) {
  const Config& c = m_.config;
  const int64_t D = c.hidden_size, hc = c.hc_mult, hd = c.head_dim, W = c.sliding_window, Lm = c.num_layers;
  const LayerWeights& lw = layer_weights(Lm);
  CpuActivations& a = act_;
  const float* X = a.x.data();
  const int64_t hrows = layout_.tensors[size_t(layout_.hidden)].rows;
  // The rows: per run, positions [pos0 − 1, pos0 + n − 1) (from 0), each with the token after it.
  int64_t n = 0;
  for (const Segment& s : plan_)
    for (int64_t t = std::max<int64_t>(s.pos0 - 1, 0); t < s.pos0 + s.n - 1; ++t, ++n) {
      a.mtp_tok[size_t(n)] = b.token[s.row0 + (t + 1 - s.pos0)];
      a.mtp_pos[size_t(n)] = int32_t(t);
      a.mtp_slot[size_t(n)] = s.slot;
      const float* src = t < s.pos0 ? hidden_row(s.slot, t) : X + (s.row0 + t - s.pos0) * hc * D;
      std::memcpy(a.mtp_x.data() + n * hc * D, src, size_t(hc * D) * 4);
    }
  // The hidden ring: each run's last positions (after the row of pos0 − 1 was read).
  for (const Segment& s : plan_)
    for (int64_t q = std::max<int64_t>(s.pos0, s.pos0 + s.n - hrows); q < s.pos0 + s.n; ++q)
      std::memcpy(hidden_row(s.slot, q), X + (s.row0 + q - s.pos0) * hc * D, size_t(hc * D) * 4);
  if (n == 0) return;
  float* xin = a.mtp_in.data();
  mtp_input(*this, a.mtp_tok.data(), a.mtp_x.data(), n, xin);
  hc_pre_cpu(HcParams{lw.hc_attn.fn.data(), lw.hc_attn.base.data(), lw.hc_attn.scale.data(), hc, D,
                      c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps},
             xin, n, a.a.data(), a.post.data(), a.comb.data(), a.hc_scratch.data());
  rms_norm_cpu(a.a.data(), lw.attn_norm.data(), n, D, c.rms_norm_eps, a.normed.data());
  float* kv = a.kv.data();
  attention_kv(*this, lw, m_.rope_main, a.normed.data(), n, a.mtp_pos.data(), kv);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(layer_slot(a.mtp_slot[size_t(i)], Lm).window + (a.mtp_pos[size_t(i)] % W) * hd, kv + i * hd,
                size_t(hd) * 4);
}

void CpuBackend::draft(const DraftRequest& r) {
  const Config& c = m_.config;
  const Weights& w = m_.weights;
  const int64_t D = c.hidden_size, hc = c.hc_mult, hd = c.head_dim, W = c.sliding_window, V = c.vocab_size;
  const int64_t Lm = c.num_layers, n = r.n, k = r.k;
  if (!has_mtp()) fail("draft: the model was loaded without its MTP block (load it with the MTP weights)");
  if (opt_.ep_comm && opt_.ep_comm->size() > 1) fail("draft: MTP with expert parallelism is not supported yet");
  check_draft(r, shape_, V, pos_.data());
  CpuActivations& a = act_;
  last_rows_ = -1;  // the logits a draft makes are its own
  // The window rows the k passes write, kept to put back.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      std::memcpy(a.draft_save.data() + (i * kMaxDraft + j) * hd,
                  layer_slot(r.slot[i], Lm).window + ((pos_[size_t(r.slot[i])] - 1 + j) % W) * hd, size_t(hd) * 4);
  auto put_back = [&] {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j)
        std::memcpy(layer_slot(r.slot[i], Lm).window + ((pos_[size_t(r.slot[i])] - 1 + j) % W) * hd,
                    a.draft_save.data() + (i * kMaxDraft + j) * hd, size_t(hd) * 4);
    batch_ = nullptr;
  };
  try {
    for (int64_t i = 0; i < n; ++i) {
      a.mtp_tok[size_t(i)] = r.token[i];
      a.mtp_slot[size_t(i)] = r.slot[i];
      std::memcpy(a.mtp_x.data() + i * hc * D, hidden_row(r.slot[i], pos_[size_t(r.slot[i])] - 1), size_t(hc * D) * 4);
    }
    const MtpWeights& mw = w.mtp[0];
    std::vector<SampleParams> params((size_t(n)));
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t i = 0; i < n; ++i) a.mtp_pos[size_t(i)] = int32_t(pos_[size_t(r.slot[i])] - 1 + j);
      mtp_batch_ = Batch{int32_t(n), a.mtp_tok.data(), a.mtp_pos.data(), a.mtp_slot.data(), a.mtp_want.data()};
      batch_ = &mtp_batch_;
      plan_.build(mtp_batch_);
      first_bad_.clear();
      float* X = a.mtp_in.data();
      mtp_input(*this, a.mtp_tok.data(), a.mtp_x.data(), n, X);
      layer_forward(Lm, X, n);
      std::memcpy(a.mtp_x.data(), X, size_t(n * hc * D) * 4);  // the next pass reads this one's streams
      HcHeadParams hp{mw.hc_head_fn.data(), mw.hc_head_base.data(), mw.hc_head_scale.data(), hc, D, c.hc_eps,
                      c.rms_norm_eps};
      float* y = a.final_y.data();
      hc_head_cpu(hp, X, n, y, a.hc_scratch.data());
      rms_norm_cpu(y, mw.norm.data(), n, D, c.rms_norm_eps, y);
      linear(w.head, y, n, a.draft_logits.data());
      for (int64_t i = 0; i < n; ++i) {
        params[size_t(i)] = r.params ? r.params[i] : SampleParams{};
        params[size_t(i)].counter += uint64_t(j);
      }
      SampleArgs sa;
      sa.logits = a.draft_logits.data(), sa.rows = n, sa.vocab = V, sa.params = params.data();
      sa.token = a.mtp_tok.data(), sa.logprob = a.draft_lp.data(), sa.status = a.draft_status.data();
      sample_rows_cpu(sa);
      for (int64_t i = 0; i < n; ++i) {
        if (a.draft_status[size_t(i)] != kSampleOk)
          fail("draft: slot {}: non-finite MTP logits (the first intermediate that went non-finite is {})", r.slot[i],
               first_bad_.empty() ? std::string("the LM head") : first_bad_);
        r.out[i * k + j] = a.mtp_tok[size_t(i)];
      }
    }
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
}

}  // namespace cm
