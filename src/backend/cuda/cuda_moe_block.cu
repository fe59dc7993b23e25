// The MoE half of a CUDA layer (CudaBackend::moe, expert), in the order and math of model/moe.cpp.
#include "backend/cuda/cuda_backend_impl.h"

#include "backend/cuda/core/cuda_errors.h"
#include "comm/comm.h"
#include "ops/router.h"
#include "ops/swiglu.h"

namespace cm {

// y = w2 · (silu(min(w1·x, L)) ⊙ clamp(w3·x, −L, L)) for n rows (f32 x and y).
// x_bf: the bf16 copy of x (for FP8/NVFP4 w1, w3).
void CudaBackend::expert(const cuda::DevExpert& e, const float* x, const uint16_t* x_bf, int64_t n, float* y) {
  const int64_t I = e.w1.N;
  float *g = P<float>(act_.g), *up = P<float>(act_.up);
  // w1 and w3 share their input: one decode launch for both (each output with its own launch's bits).
  if (!x_bf || !linear_pair("w1+w3", e.w1, e.w3, x_bf, n, g, up)) {
    linear2(e.w1, x, x_bf, n, g);
    linear2(e.w3, x, x_bf, n, up);
  }
  // SwiGLU writes bf16 for an FP8/NVFP4 w2 (the bits of the cast its f32 output would get).
  const bool hb = e.w2.wants_bf16_input();
  void* h = hb ? static_cast<void*>(P<uint16_t>(act_.h_bf)) : static_cast<void*>(g);
  {
    cuda::OpScope op(*ctx_, "swiglu");
    swiglu_cuda(*ctx_, g, up, I, n, I, m_.config.swiglu_limit, nullptr, h, hb);
  }
  linear(e.w2, h, hb, n, y);
}

// The MoE block of layer L (normed → out): router, routed experts, shared expert (model/moe.cpp).
void CudaBackend::moe(int64_t L, int64_t n) {
  const Config& c = m_.config;
  const cuda::DevLayer& lw = dev_layer(L);
  Context& ctx = *ctx_;
  Act& a = act_;
  const int64_t D = c.hidden_size, E = c.n_routed_experts, K = c.n_experts_per_tok;
  const float* normed = P<float>(a.normed_ffn);
  const uint16_t* normed_bf = P<uint16_t>(a.normed_bf);  // written by the ffn norm
  float *router = P<float>(a.router), *ew = P<float>(a.ew), *routed = P<float>(a.routed), *out = P<float>(a.out_ffn);
  int32_t* eidx = P<int32_t>(a.eidx);

  // With packed experts (their own scratch) the shared expert runs on the side stream beside the router
  // and the routed experts (the separate-linear experts share its g/up buffers: one stream then).
  float* sy = P<float>(a.sy);
  const bool shared_aside = lw.has_shared && lw.experts;
  if (shared_aside) on_side(n, [&] { expert(lw.shared, normed, normed_bf, n, sy); });
  linear2(lw.gate, normed, normed_bf, n, router);
  note("router_logits", L, router, false, E, {E});
  RouterParams rp;
  rp.experts = E;
  rp.topk = K;
  rp.routed_scaling = float(c.routed_scaling_factor);
  rp.bias = lw.gate_bias.buf.size() ? lw.gate_bias.p() : nullptr;
  rp.tid2eid = lw.tid2eid.size() ? lw.tid2eid.as<const int32_t>() : nullptr;
  rp.vocab = c.vocab_size;
  {
    cuda::OpScope op(ctx, "route");
    route_cuda(ctx, rp, d_token_, router, n, eidx, ew);
  }

  if (lw.experts) {
    // Packed FP4 experts (on the norm's bf16 copy): routing lists, gate/up + SwiGLU, down, k-ordered
    // combine on the device.
    // Expert parallelism: this rank's experts only, their rows summed over the ranks before the combine.
    const cuda::MoeExchange ex{this, [](void* self, float* yk, int64_t count) {
                                 auto* be = static_cast<CudaBackend*>(self);
                                 be->opt_.ep_comm->all_reduce_sum_on(be->ctx_->stream(), yk, count, CommType::F32);
                               }};
    {
      cuda::OpScope op(ctx, "moe_nvfp4 (routed experts)");
      cuda::moe_nvfp4(ctx, *lw.experts, *moe_scratch_, normed_bf, int(n), eidx, ew, routed, cuda::MoePath::automatic,
                      ep_exchange() ? &ex : nullptr);
    }
  } else {
    // Experts as separate linears: each over every row, added with the row's weight for it
    // (0 when not chosen) in ascending expert order, as the CPU sums. Expert parallelism keeps
    // that one chain of additions: in round q rank q adds its experts to the sum so far and the
    // others hold +0, so the all-reduce hands every rank rank q's partial sum exactly.
    float *we = P<float>(a.we), *ey = P<float>(a.ey);
    {
      cuda::OpScope op(ctx, "moe_expert_weights");
      cuda::moe_expert_weights(ctx, eidx, ew, n, K, E, we);
      CM_CUDA(cudaMemsetAsync(routed, 0, size_t(n * D) * 4, ctx.stream()));
    }
    const int R = ep_ranks(), rank = R > 1 ? opt_.ep_comm->rank() : 0;
    for (int q = 0; q < R; ++q) {
      if (q == rank) {
        for (size_t i = 0; i < lw.dense_experts.size(); ++i) {
          const int64_t e = lw.dense_first + int64_t(i);
          expert(lw.dense_experts[i], normed, normed_bf, n, ey);
          cuda::OpScope op(ctx, "axpy_rows");
          cuda::axpy_rows(ctx, we + e * n, ey, n, D, routed);
        }
      } else {
        CM_CUDA(cudaMemsetAsync(routed, 0, size_t(n * D) * 4, ctx.stream()));
      }
      if (ep_exchange()) opt_.ep_comm->all_reduce_sum_on(ctx.stream(), routed, n * D, CommType::F32);
    }
  }
  note("moe_routed", L, routed, false, D, {D});
  join_side();
  if (lw.has_shared) {
    if (!shared_aside) expert(lw.shared, normed, normed_bf, n, sy);
    note("moe_shared", L, sy, false, D, {D});
  }
  {
    cuda::OpScope op(ctx, "add");
    if (lw.has_shared)
      cuda::add_f32(ctx, routed, sy, n * D, out);
    else
      CM_CUDA(cudaMemcpyAsync(out, routed, size_t(n * D) * 4, cudaMemcpyDeviceToDevice, ctx.stream()));
  }
}

}  // namespace cm
