// CudaBackend::reserve: every device buffer of a reservation (activations for max_step_tokens rows, the
// per-slot state of backend/step_plan.h's layout, the MoE scratch), checked against the memory budget
// before anything is allocated.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>

#include "backend/cuda/core/cuda_errors.h"
#include "ops/attention.h"

namespace cm {

void CudaBackend::reserve(const CacheShape& shape) {
  const Config& c = m_.config;
  check_reserve(shape, c);
  CM_CUDA(cudaStreamSynchronize(ctx_->stream()));
  clear_graphs();  // they point into the buffers this reservation replaces
  // Drop the old buffers first so their memory counts as free.
  shape_ = CacheShape{0, 0, 0};
  state_.release();
  undo_log_.release();
  undo_spans_.release();
  act_ = Act{};
  moe_scratch_.reset();
  if (plan_host_) CM_CUDA(cudaFreeHost(plan_host_));
  plan_host_ = nullptr;
  if (sample_host_) CM_CUDA(cudaFreeHost(sample_host_));
  sample_host_ = nullptr;
  if (draft_host_) CM_CUDA(cudaFreeHost(draft_host_));
  draft_host_ = nullptr;
  if (undo_host_) CM_CUDA(cudaFreeHost(undo_host_));
  undo_host_ = nullptr;
  last_logit_rows_ = 0;

  Act& a = act_;
  Reservation r = plan_reservation(shape, a);
  const int64_t N = shape.max_step_tokens, S = shape.max_slots;
  const bool mtp = has_mtp();
  const StateLayout& layout = r.layout;
  const size_t undo_log_bytes = r.undo_log_bytes, undo_span_bytes = r.undo_span_bytes;
  const SampleStage stage = r.stage;
  const DraftStage dstage = r.dstage;
  const std::vector<Want>& wants = r.wants;
  const cuda::DevLayer* packed = r.packed;
  const int64_t K = m_.config.n_experts_per_tok;
  max_notes_ = r.max_notes;
  // The whole backend against the budget: what it holds (weights, Contexts) plus this reservation,
  // with 64 MiB to spare for the CUDA runtime.
  const size_t held = dm_->total_bytes + ctx_bytes();
  const size_t work = r.act_bytes + r.moe_bytes + obs_.reserve_bytes() + ctx_bytes() + (size_t(64) << 20);
  cuda::check_memory(cuda::memory_budget(opt_.gpu_memory_utilization, held), dm_->total_bytes + r.state_bytes + work,
                     cuda::strf("weights %s, per-slot state %s for %lld slots of %lld tokens, activations and "
                                "workspaces %s for %lld-token steps",
                                gib(dm_->total_bytes).c_str(), gib(r.state_bytes).c_str(), (long long)S,
                                (long long)shape.max_ctx, gib(work).c_str(), (long long)N));

  for (const Want& w : wants) w.buf->alloc(size_t(std::max<int64_t>(w.bytes, 4)));
  if (packed) moe_scratch_ = std::make_unique<cuda::MoeScratch>(*packed->experts, int(N), int(K));
  state_.alloc(std::max<size_t>(layout.bytes, 4));
  state_.zero();
  undo_log_.alloc(std::max<size_t>(undo_log_bytes, 4));
  undo_spans_.alloc(std::max<size_t>(undo_span_bytes, 24));
  undo_ = std::move(r.undo);
  a.counts.zero();
  obs_.reserve();
  CM_CUDA(cudaMallocHost(reinterpret_cast<void**>(&plan_host_), size_t((mtp ? 9 : 4) * N) * 4));
  CM_CUDA(cudaMallocHost(reinterpret_cast<void**>(&sample_host_), stage.bytes));
  sample_ = stage;
  draft_ = dstage;
  if (mtp) CM_CUDA(cudaMallocHost(reinterpret_cast<void**>(&draft_host_), dstage.bytes));
  undo_host_entries_ = 2 * std::max<size_t>(undo_span_bytes / sizeof(int64_t), 3);
  CM_CUDA(cudaMallocHost(reinterpret_cast<void**>(&undo_host_), undo_host_entries_ * sizeof(int64_t)));
  rollback_used_ = 0;

  // Per-layer state views into the shared layout (slot-major tensors).
  layout_ = layout;
  layers_.assign(size_t(c.num_layers + (mtp ? 1 : 0)), LayerState{});
  void* base = state_.get();
  auto comp = [&](CompressorStateView& v, const CompressorLayout& cl) {
    v.ratio = cl.ratio, v.c = cl.c, v.dc = cl.dc, v.max_slots = S, v.max_entries = cl.max_entries;
    v.pend_kv = layout_.at<float>(base, cl.pend_kv, 0);
    v.pend_gate = layout_.at<float>(base, cl.pend_gate, 0);
    v.entries = layout_.at<uint16_t>(base, cl.entries, 0);
  };
  for (int64_t L = 0; L < int64_t(layers_.size()); ++L) {
    const LayerStateLayout& ll = layout_.layers[size_t(L)];
    LayerState& ls = layers_[size_t(L)];
    ls.window = layout_.at<uint16_t>(base, ll.window, 0);
    if (ll.comp.present()) comp(ls.comp, ll.comp);
    if (ll.index.present()) comp(ls.index, ll.index);
  }
  pos_.assign(size_t(S), 0);
  plan_.reserve(shape);
  notes_.clear();
  notes_.reserve(max_notes_);
  d_token_ = P<int32_t>(a.plan);
  d_pos_ = d_token_ + N;
  d_slot_ = d_pos_ + N;
  d_rows_ = d_slot_ + N;
  d_mtok_ = mtp ? d_rows_ + N : nullptr;
  d_mpos_ = mtp ? d_mtok_ + N : nullptr;
  d_mslot_ = mtp ? d_mpos_ + N : nullptr;
  d_msrc_ = mtp ? d_mslot_ + N : nullptr;
  d_rdst_ = mtp ? d_msrc_ + N : nullptr;
  shape_ = shape;
}

// Every buffer a reservation of `shape` allocates, with its bytes (the activations into `a`'s buffers).
CudaBackend::Reservation CudaBackend::plan_reservation(const CacheShape& shape, Act& a) const {
  const Config& c = m_.config;
  const int64_t N = shape.max_step_tokens, S = shape.max_slots, D = c.hidden_size, hc = c.hc_mult;
  const int64_t H = c.num_heads, hd = c.head_dim, E = c.n_routed_experts, K = c.n_experts_per_tok;
  const int64_t I = c.moe_inter, ih = c.index_head_dim, inh = c.index_n_heads, G = c.o_groups, ol = c.o_lora_rank;
  const bool mtp = has_mtp();
  Reservation r;
  r.layout = make_state_layout(c, S, shape.max_ctx, 2, mtp);
  const StateLayout& layout = r.layout;
  r.undo.reserve(layout);  // rollback_slot's log: a few rows per slot and layer
  r.undo_log_bytes = size_t(S) * r.undo.log_bytes_per_slot();
  r.undo_span_bytes = size_t(S) * size_t(r.undo.max_copies_per_slot()) * 3 * sizeof(int64_t);
  int64_t max_ie = 1;
  for (const LayerStateLayout& ll : layout.layers)
    if (ll.index.present()) max_ie = std::max(max_ie, ll.index.max_entries);
  std::vector<const cuda::DevLayer*> all_layers;  // the model's, then the MTP block's
  for (const cuda::DevLayer& l : dm_->layers) all_layers.push_back(&l);
  if (mtp) all_layers.push_back(&dm_->mtp->block);
  const bool dense_moe = std::any_of(all_layers.begin(), all_layers.end(),
                                     [](const cuda::DevLayer* l) { return !l->experts; });
  // Split attention partials for up to 64 tokens of the longest layer's candidates (window + top-k, or
  // window + every HCA entry at max_ctx), at most 256 MiB; a step that needs more takes the in-CTA path.
  int64_t max_cand = 0;
  for (int64_t L = 0; L < c.num_layers; ++L) {
    const AttnKind k = c.attn_kinds[size_t(L)];
    const int64_t comp = k == AttnKind::CSA   ? c.index_topk
                         : k == AttnKind::HCA ? layout.layers[size_t(L)].comp.max_entries
                                              : 0;
    max_cand = std::max(max_cand, c.sliding_window + comp);
  }
  const int64_t attn_ws_floats =
      std::min(attention_split_floats(H, hd, max_cand, std::min<int64_t>(N, 64)), int64_t(64) << 20);
  r.max_notes = size_t(2 + 16 * (c.num_layers + (mtp ? 1 : 0)));
  const int64_t max_k = std::max({D, c.q_lora_rank, H * hd, G * ol, I});
  // Every activation buffer: name, bytes.
  r.stage = sample_stage(sample_rows_for(shape, mtp), c.vocab_size);
  r.dstage = draft_stage(S, hd);
  const SampleStage& stage = r.stage;
  const DraftStage& dstage = r.dstage;
  r.wants = {
      {&a.plan, (mtp ? 9 : 4) * N * 4},           {&a.x, N * hc * D * 4},        {&a.x_alt, N * hc * D * 4},
      {&a.normed, N * D * 4},         {&a.normed_bf, N * D * 2},     {&a.qr_bf, N * c.q_lora_rank * 2},
      {&a.out, N * D * 4},            {&a.post, N * hc * 4},         {&a.normed_ffn, N * D * 4},
      {&a.out_ffn, N * D * 4},
      {&a.comb, N * hc * hc * 4},     {&a.qr, N * c.q_lora_rank * 4}, {&a.qf, N * H * hd * 4},
      {&a.q_bf, N * H * hd * 2},      {&a.kvf, N * hd * 4},          {&a.kv_bf, N * hd * 2},
      {&a.o_bf, N * H * hd * 2},      {&a.u, N * G * ol * 4},        {&a.u_bf, N * G * ol * 2},
      {&a.h_bf, N * I * 2},        {&a.ckv, N * 2 * hd * 4},
      {&a.cgate, N * 2 * hd * 4},     {&a.ikv, N * 2 * ih * 4},      {&a.igate, N * 2 * ih * 4},
      {&a.iqf, N * inh * ih * 4},     {&a.iq_bf, N * inh * ih * 2},  {&a.iw, N * inh * 4},
      {&a.iscore, N * max_ie * 4},    {&a.sel, N * c.index_topk * 4}, {&a.sel_score, N * c.index_topk * 4},
      {&a.router, N * E * 4},         {&a.eidx, N * K * 4},          {&a.ew, N * K * 4},
      {&a.we, dense_moe ? E * N * 4 : 0}, {&a.g, N * I * 4},
      {&a.up, N * I * 4},             {&a.ey, N * D * 4},            {&a.routed, N * D * 4},
      {&a.sy, N * D * 4},             {&a.final_y, N * D * 4},
      {&a.logits, N * c.vocab_size * 4}, {&a.cast, N * max_k * 2},   {&a.counts, int64_t(r.max_notes) * N * 4},
      {&a.hc_part, int64_t(hc_mix_scratch_floats(hc, D, N)) * 4},
      {&a.attn_ws, attn_ws_floats * 4},     {&a.sample, int64_t(stage.bytes)},
      {&a.mtp_x, mtp ? N * hc * D * 4 : 0}, {&a.mtp_emb, mtp ? N * D * 4 : 0}, {&a.mtp_e, mtp ? N * D * 4 : 0},
      {&a.mtp_bf, mtp ? N * hc * D * 2 : 0}, {&a.draft, mtp ? int64_t(dstage.bytes) : 0},
  };
  for (const Want& w : r.wants) r.act_bytes += size_t(w.bytes);
  r.state_bytes = layout.bytes + r.undo_log_bytes + r.undo_span_bytes;
  for (const cuda::DevLayer* l : all_layers)
    if (l->experts) r.packed = l;
  // MoeScratch: per (token, k) h and yk rows and the lists; per token the permuted x of the wgmma prefill.
  r.moe_bytes = r.packed ? size_t(N * K) * size_t(2 * I + 4 * D + 8) + size_t(N) * size_t(2 * D) + size_t(E) * 64 : 0;
  return r;
}

size_t CudaBackend::reserve_bytes(const CacheShape& shape) const {
  check_reserve(shape, m_.config);
  Act scratch;  // sizes only: nothing is allocated
  return plan_reservation(shape, scratch).total() + obs_.reserve_bytes();
}

size_t CudaBackend::reserve_budget() const {
  const size_t held = dm_->total_bytes + ctx_bytes(), spare = held + ctx_bytes() + (size_t(64) << 20);
  const size_t avail = cuda::memory_budget(opt_.gpu_memory_utilization, held).available();
  return avail > spare ? avail - spare : 0;
}

}  // namespace cm
