// Small kernels of the CUDA model backend's step (cuda_backend.cu) that no op
// family owns: casts, sums, row gathers and the non-finite counts behind the
// step's error message. Plain C++ declarations
// (device pointers), launched on the context's stream.
#pragma once
#include <cstdint>

namespace cm::cuda {

class Context;

// y[r, c] = bf16(x[r, c]) for r < rows, c < cols (rows ldx / ldy apart).
void cast_f32_bf16(Context& ctx, const float* x, int64_t ldx, int64_t rows, int64_t cols, uint16_t* y, int64_t ldy);

// y[i] = a[i] + b[i], f32.
void add_f32(Context& ctx, const float* a, const float* b, int64_t n, float* y);
// x[i] *= s, f32.
void scale_f32(Context& ctx, float* x, int64_t n, float s);

// y[t, :] += a[t] · x[t, :] for t < T (the dense-expert MoE adds expert e's rows, weight 0 for rows that
// did not pick e, in ascending expert order as the CPU does).
void axpy_rows(Context& ctx, const float* a, const float* x, int64_t T, int64_t D, float* y);
// w_e[t] = Σ_k [id[t, k] == e] · w[t, k] (0 when row t does not use expert e), for all e < E: [E, T].
void moe_expert_weights(Context& ctx, const int32_t* ids, const float* w, int64_t T, int64_t topk, int64_t E, float* we);

// y[r] = x[rows[r]] for r < R, rows of `width` floats.
void gather_rows(Context& ctx, const float* x, const int32_t* rows, int64_t R, int64_t width, float* y);

// For each of n spans (device [n, 3] int64: dst offset, src offset, bytes): dst[dst offset...] =
// src[src offset...] (rollback_slot's undo log: state rows to the log before a step, back on rollback).
void copy_spans(Context& ctx, const int64_t* spans, int64_t n, char* dst, const char* src);

// out[t, j] = j < topk and idx[t, j] >= 0 ? score[t, idx[t, j]] : 0 (the indexer's chosen scores).
void gather_scores(Context& ctx, const float* score, int64_t ld, const int32_t* idx, int64_t T, int64_t topk,
                   float* out);

// The MTP block's rows (cuda_mtp_block.cu), rows of `width` floats:
// y[i] = src[i] >= 0 ? x[src[i]] : ring[−1 − src[i]] for i < n (a step's rows or the hidden ring's).
void mtp_gather_rows(Context& ctx, const float* x, const float* ring, const int32_t* src, int64_t n, int64_t width,
                     float* y);
// ring[dst[i]] = x[i] for i < n with dst[i] >= 0 (the hidden ring keeps a slot's last rows).
void scatter_rows(Context& ctx, const float* x, const int32_t* dst, int64_t n, int64_t width, float* ring);
// x[t, k, :] += e[t, :] for t < n, k < hc (e_proj's row added to every stream's h_proj row).
void add_to_streams(Context& ctx, const float* e, int64_t n, int64_t hc, int64_t D, float* x);
// After a draft pass (one thread block): out[j·n + i] = tok[i] and out_status[j·n + i] = status[i] for
// the pass j = *pass (a row that failed goes on with token 0), then pos[i] += 1, the draw counter of params[i] += 1 and *pass += 1.
// params: SampleParams [n] (ops/sample.h).
void mtp_advance(Context& ctx, int32_t* tok, const int32_t* status, int64_t n, void* params, int32_t* pos,
                 int32_t* out, int32_t* out_status, int32_t* pass);

// Up to kMax intermediates whose non-finite values are counted by one launch.
struct NonFiniteBatch {
  static constexpr int kMax = 16;  // a layer's ~12: one launch per layer
  int count = 0;
  const void* x[kMax];    // rows of `width` values, f32 or bf16
  int64_t width[kMax];
  bool bf16[kMax];
  int32_t* out[kMax];     // out[r] = number of NaN/Inf among x[r, 0:width]
};
// Counts every intermediate of the batch over its first `rows` rows, in one launch (the step
// notes ~12 intermediates per layer: one launch each cost more than the counting).
void count_non_finite(Context& ctx, const NonFiniteBatch& b, int64_t rows);

}  // namespace cm::cuda
