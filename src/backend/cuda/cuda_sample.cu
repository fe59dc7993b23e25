// Sampling the last step's logits rows where they are (ModelBackend::sample_last_step): the rows'
// parameters, adjustments and masks go up in one pinned staging buffer, one kernel (ops/sample.h)
// samples every row, and only tokens, logprobs and statuses come back — R x 12 bytes instead of
// R x vocab x 4.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/core/cuda_errors.h"

namespace cm {

CudaBackend::SampleStage CudaBackend::sample_stage(int64_t rows, int64_t vocab) {
  SampleStage s;
  s.rows = rows;
  s.mask_words = (vocab + 31) / 32;
  cuda::StagePacker pk;
  s.params = pk.take(size_t(rows) * sizeof(SampleParams));
  s.offsets = pk.take(size_t(rows + 1) * 8);
  s.adj = pk.take(size_t(kMaxSampleAdjust) * sizeof(SampleAdjust));
  s.mask = pk.take(size_t(rows * s.mask_words) * 4);
  s.token = pk.take(size_t(rows) * 4);
  s.logprob = pk.take(size_t(rows) * 4);
  s.status = pk.take(size_t(rows) * 4);
  s.top_id = pk.take(size_t(rows) * kMaxSampleTopN * 4);  // right after status: one download brings them all
  s.top_lp = pk.take(size_t(rows) * kMaxSampleTopN * 4);
  s.bytes = pk.at;
  return s;
}

void CudaBackend::sample_last_step(const StepSampling& in) {
  const int64_t R = last_logit_rows_, V = m_.config.vocab_size;
  const SampleStage& st = sample_;
  CM_CU_CHECK(sample_host_ != nullptr, "sample_last_step: the backend is not reserved");
  CM_CU_CHECK(R <= st.rows, "sample_last_step: %lld rows with logits, more than the %lld reserved (max_sample_rows)",
              (long long)R, (long long)st.rows);
  CM_CU_CHECK(in.params && in.token && in.logprob && (!in.adj == !in.adj_offsets),
              "sample_last_step: params, token and logprob are required (adj with its offsets)");
  CM_CU_CHECK(in.top_n >= 0 && in.top_n <= kMaxSampleTopN && (in.top_n == 0 || (in.top_id && in.top_logprob)),
              "sample_last_step: top_n %d must be in [0, %d] with its output arrays", in.top_n, kMaxSampleTopN);
  CM_CU_CHECK(!in.mask || in.mask_words == st.mask_words, "sample_last_step: masks of %lld words, the vocabulary needs %lld",
              (long long)in.mask_words, (long long)st.mask_words);
  if (R == 0) return;
  for (int64_t r = 0; r < R; ++r) check_sample_params(in.params[r]);
  const int64_t n_adj = in.adj ? in.adj_offsets[R] : 0;
  CM_CU_CHECK(!in.adj || (in.adj_offsets[0] == 0 && n_adj >= 0 && n_adj <= kMaxSampleAdjust),
              "sample_last_step: %lld adjustments (at most %lld per step, offsets from 0)", (long long)n_adj,
              (long long)kMaxSampleAdjust);
  if (in.adj) {
    for (int64_t r = 0; r < R; ++r)
      CM_CU_CHECK(in.adj_offsets[r + 1] >= in.adj_offsets[r], "sample_last_step: offsets of row %lld go backwards",
                  (long long)r);
    for (int64_t j = 0; j < n_adj; ++j)  // the kernel writes logits[id]: ids must be inside the row
      CM_CU_CHECK(in.adj[j].id >= 0 && in.adj[j].id < V && in.adj[j].count >= 0 && std::isfinite(in.adj[j].bias),
                  "sample_last_step: adjustment %lld: id %d outside the vocabulary, count %d or bias %g", (long long)j,
                  in.adj[j].id, in.adj[j].count, double(in.adj[j].bias));
  }

  // Up: through one pinned staging buffer, the parts in use.
  char* h = sample_host_;
  std::memcpy(h + st.params, in.params, size_t(R) * sizeof(SampleParams));
  if (in.adj) {
    std::memcpy(h + st.offsets, in.adj_offsets, size_t(R + 1) * 8);
    std::memcpy(h + st.adj, in.adj, size_t(n_adj) * sizeof(SampleAdjust));
  }
  if (in.mask) std::memcpy(h + st.mask, in.mask, size_t(R * st.mask_words) * 4);
  Context& ctx = *ctx_;
  char* d = P<char>(act_.sample);
  const auto upload = [&](size_t off, size_t bytes) {
    if (bytes) CM_CUDA(cudaMemcpyAsync(d + off, h + off, bytes, cudaMemcpyHostToDevice, ctx.stream()));
  };
  upload(st.params, in.adj ? st.offsets + size_t(R + 1) * 8 - st.params : size_t(R) * sizeof(SampleParams));
  if (in.adj) upload(st.adj, size_t(n_adj) * sizeof(SampleAdjust));
  if (in.mask) upload(st.mask, size_t(R * st.mask_words) * 4);
  SampleArgs a;
  a.logits = P<float>(act_.logits);
  a.rows = R;
  a.vocab = V;
  a.params = reinterpret_cast<const SampleParams*>(d + st.params);
  if (in.adj) {
    a.adj = reinterpret_cast<SampleAdjust*>(d + st.adj);
    a.adj_offsets = reinterpret_cast<const int64_t*>(d + st.offsets);
  }
  if (in.mask) {
    a.mask = reinterpret_cast<const uint32_t*>(d + st.mask);
    a.mask_words = st.mask_words;
  }
  a.token = reinterpret_cast<int32_t*>(d + st.token);
  a.logprob = reinterpret_cast<float*>(d + st.logprob);
  a.status = reinterpret_cast<int32_t*>(d + st.status);
  if (in.top_n > 0) {
    a.top_n = in.top_n;
    a.top_id = reinterpret_cast<int32_t*>(d + st.top_id);
    a.top_logprob = reinterpret_cast<float*>(d + st.top_lp);
  }
  {
    cuda::OpScope op(ctx, "sample");
    sample_rows_cuda(ctx, a);
  }
  // Down: tokens, logprobs and statuses (contiguous), the step's one synchronisation.
  const size_t out_bytes =
      (in.top_n > 0 ? st.top_lp + size_t(R * in.top_n) * 4 : st.status + size_t(R) * 4) - st.token;
  CM_CUDA(cudaMemcpyAsync(h + st.token, d + st.token, out_bytes, cudaMemcpyDeviceToHost, ctx.stream()));
  CM_CUDA(cudaStreamSynchronize(ctx.stream()));
  last_logit_rows_ = 0;  // the logits were adjusted in place: a second call would sample other values
  const int32_t* status = reinterpret_cast<const int32_t*>(h + st.status);
  for (int64_t r = 0; r < R; ++r) {
    CM_CU_CHECK(status[r] != kSampleNonFinite,
                "non-finite logits; the first intermediate that went non-finite is %s (run with --layer-stats for "
                "every layer's statistics)",
                first_non_finite().c_str());
    CM_CU_CHECK(status[r] == kSampleOk, "sample_last_step: row %lld: the mask allows no token", (long long)r);
  }
  std::memcpy(in.token, h + st.token, size_t(R) * 4);
  std::memcpy(in.logprob, h + st.logprob, size_t(R) * 4);
  if (in.top_n > 0) {
    std::memcpy(in.top_id, h + st.top_id, size_t(R * in.top_n) * 4);
    std::memcpy(in.top_logprob, h + st.top_lp, size_t(R * in.top_n) * 4);
  }
}

}  // namespace cm
