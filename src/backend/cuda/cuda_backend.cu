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
#include <cmath>
#include <cstdio>
#include <map>

#include "backend/cuda/step/step_kernels.h"
#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/device_observer.h"
#include "backend/cuda/core/op_timer.h"
#include "common/numeric.h"
#include "comm/comm.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/hc.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/router.h"
#include "ops/swiglu.h"
#include "backend/step_plan.h"

namespace cm {

using cuda::DeviceBuffer;
using cuda::DevLinear;
using cuda::Context;

namespace {

// Per layer, all slots: views into the state buffer (backend/step_plan.h's layout, bf16 rows).
struct LayerState {
  uint16_t* window = nullptr;  // bf16 [S, W, hd]
  CompressorStateView comp, index;
};

// A named intermediate of this step: the count buffer row it was counted into.
struct NoteTag {
  const char* what = nullptr;
  int64_t layer = -1;
};

class CudaBackend final : public ModelBackend {
 public:
  CudaBackend(const Model& m, const BackendOptions& opt, std::unique_ptr<cuda::DevModel> dm = nullptr,
              cuda::OpTimer* timer = nullptr);
  ~CudaBackend() override;
  Device device() const override { return Device::CUDA; }
  void reserve(const CacheShape& shape) override;
  const CacheShape& shape() const override { return shape_; }
  size_t bytes_per_slot(const CacheShape& shape) const override;
  int64_t slot_pos(int32_t slot) const override;
  void reset_slot(int32_t slot) override;
  void copy_slot(int32_t from, int32_t to) override;
  void step(const Batch& batch, float* logits_out) override;
  size_t host_copies() const { return obs_.host_copies(); }

 private:
  // Activations for max_step_tokens rows (N), all device buffers.
  struct Act {
    DeviceBuffer plan;  // int32 [4N]: token, pos, slot, logit rows
    // x: the hc streams after each layer; x_alt: after a layer's attention half (the fused hc_post
    // writes out of place, hc_post_mix_cuda), then the head's gathered rows. normed_bf, qr_bf: the
    // bf16 copies of normed and qr that their norms write for the FP8/NVFP4 linears (a row is cast
    // once, not once per linear).
    // normed_ffn, out_ffn: the MoE half's input and output (the attention half's normed and out stay
    // as noted until the layer's one non-finite count, flush_counts).
    DeviceBuffer x, x_alt, normed, normed_ffn, normed_bf, out, out_ffn, post, comb;
    // u_bf, h_bf: wo_a's and the experts' SwiGLU outputs in bf16 when the next linear is FP8/NVFP4.
    DeviceBuffer qr, qr_bf, qf, q_bf, kvf, kv_bf, o_bf, u, u_bf, h_bf;
    DeviceBuffer ckv, cgate, ikv, igate, iqf, iq_bf, iw, iscore, sel, sel_score;
    DeviceBuffer router, eidx, ew, we, g, up, ey, routed, sy, hc_part;
    DeviceBuffer final_y, logits, cast, counts;
    DeviceBuffer attn_ws;  // f32 partials of split (decode) attention; see attention_sink_cuda
  };

  void check_slot(int32_t slot, const char* what) const;
  void attention(int64_t L, int64_t n, int64_t max_pos);
  void moe(int64_t L, int64_t n);
  void expert(const cuda::DevExpert& e, const float* x, const uint16_t* x_bf, int64_t n, float* y);
  void linear(const DevLinear& w, const void* x, bool x_bf16, int64_t M, void* y, int64_t ldx = 0,
              int64_t ldy = 0);
  // A linear over f32 rows x [M, K] that come with their bf16 copy xb: the FP8/NVFP4 linears read
  // xb (the bits their own cast would make), the dense ones x.
  void linear2(const DevLinear& w, const float* x, const uint16_t* xb, int64_t M, void* y) {
    if (w.wants_bf16_input())
      linear(w, xb, true, M, y);
    else
      linear(w, x, false, M, y);
  }
  void note(const char* what, int64_t layer, const void* data, bool bf16, int64_t width,
            const std::vector<int64_t>& inner);
  void observe_entries(int64_t L, const CompressorStateView& comp, const CompressorStateView* index);
  std::string first_non_finite();
  void flush_counts();
  // Every kernel of a step from the embedding to the LM head (no host synchronisation): run eagerly,
  // or captured into a graph by run_graph. max_pos bounds the indexer's grid (kernels also bound
  // each row by its own position, so a larger value changes no result).
  void forward(int64_t n, int64_t R, int64_t max_pos);
  // Replays (capturing on first use) the graph of a step with n rows and R logits rows; false when
  // kMaxGraphs other shapes are kept already (the caller runs the step eagerly).
  bool run_graph(int64_t n, int64_t R);
  void clear_graphs();
  // Op timing (bench model): an event after each op call, labelled (op_timer.h).
  void mark(const char* label) {
    if (timer_) timer_->mark(label, ctx_->stream());
  }

  const Model& m_;
  BackendOptions opt_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<cuda::DevModel> dm_;
  std::unique_ptr<cuda::MoeScratch> moe_scratch_;
  CacheShape shape_{0, 0, 0};
  StateLayout layout_;
  DeviceBuffer state_;
  std::vector<LayerState> layers_;
  std::vector<int64_t> pos_;
  Act act_;
  int32_t* plan_host_ = nullptr;  // pinned [4N]
  StepPlan plan_;
  std::vector<NoteTag> notes_;
  size_t max_notes_ = 0;
  cuda::NonFiniteBatch pending_counts_;  // noted, not yet counted (flush_counts)
  // Captured steps by (rows, logits rows), each with the notes its capture made (their names);
  // cleared by reserve() (a new reservation moves every buffer the graphs point to).
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<NoteTag> notes;
  };
  std::map<std::pair<int64_t, int64_t>, StepGraph> graphs_;
  cuda::DeviceObserver obs_;  // the observer's path; every device-to-host copy
  cuda::OpTimer* timer_ = nullptr;
  int64_t n_ = 0;  // rows of the current step
  const int32_t *d_token_ = nullptr, *d_pos_ = nullptr, *d_slot_ = nullptr, *d_rows_ = nullptr;
};

template <typename T>
T* P(const DeviceBuffer& b) {
  return b.as<T>();
}

HcParams hc_params(const Config& c, const cuda::DevF32& fn, const cuda::DevF32& base, const cuda::DevF32& scale) {
  return HcParams{fn.p(), base.p(), scale.p(), c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters, c.hc_eps,
                  c.rms_norm_eps};
}

// "l<L>.s<slot>.<what>" (layer < 0: "s<slot>.<what>"), the CPU backend's names.
std::string note_name(const char* what, int64_t layer, int32_t slot) {
  return layer >= 0 ? cuda::strf("l%lld.s%d.%s", (long long)layer, slot, what) : cuda::strf("s%d.%s", slot, what);
}

using cuda::gib;

// Device memory for the Context's workspaces and the CUDA runtime, counted when the weights load
// (before the Context exists); reserve() counts the Context's real bytes.
constexpr size_t kWorkingBytes = size_t(256) << 20;

// Steps of up to kGraphMaxRows rows run as CUDA graphs (decode batches and short prefill chunks: the
// launches of a ~1,500-kernel step cost more than the kernels at small batches); at most kMaxGraphs
// distinct (rows, logits rows) shapes are kept, further shapes run eagerly.
using cuda::kGraphMaxRows;
constexpr size_t kMaxGraphs = 64;

// A linear's op label: its name without the "layers.<L>." prefix ("attn.wq_a"), a pointer into the name.
const char* op_label(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return name.c_str();
  const size_t dot = name.find('.', 7);
  return dot == std::string::npos ? name.c_str() : name.c_str() + dot + 1;
}

}  // namespace

CudaBackend::CudaBackend(const Model& m, const BackendOptions& opt, std::unique_ptr<cuda::DevModel> dm,
                         cuda::OpTimer* timer)
    : m_(m), opt_(opt), obs_(opt.observer), timer_(timer) {
  if (opt.linear_inputs) cuda::throw_error("cuda: the linear-input observer (calibration) runs on the CPU backend only");
  if (opt.act_quant != ActQuant::NONE) cuda::throw_error("cuda: W4A4 emulation runs on the CPU backend only");
  // Expert parallelism is not built here yet: refuse it rather than run a rank's experts as all of them.
  CM_CU_CHECK(!opt.ep_comm || opt.ep_comm->size() <= 1,
              "cuda: expert parallelism over %d ranks (BackendOptions::ep_comm) is not built for the CUDA backend "
              "yet; one GPU runs every routed expert",
              opt.ep_comm ? opt.ep_comm->size() : 1);
  CM_CU_CHECK(dm || (m.weights.experts_first == 0 && m.weights.experts_end == m.config.n_routed_experts),
              "cuda: the model holds routed experts [%lld, %lld) of %lld (LoadOptions::experts); the CUDA backend "
              "runs all of them, so load the model whole",
              (long long)m.weights.experts_first, (long long)m.weights.experts_end,
              (long long)m.config.n_routed_experts);
  // The weights first: a model that does not fit is refused before anything is allocated.
  // A prebuilt device model (the synthetic bench builds it a layer at a time) is taken as is.
  dm_ = dm ? std::move(dm) : cuda::upload_model(m, kWorkingBytes, opt.gpu_memory_utilization);
  CM_CU_CHECK(dm_->layers.size() == size_t(m.config.num_layers), "cuda: the device model has %zu layers, the config %lld",
              dm_->layers.size(), (long long)m.config.num_layers);
  // The split-K workspace, and panel scratch only for --fast-prefill (the batch-invariant step never
  // takes the cuBLAS path).
  ctx_ = std::make_unique<Context>(0, true, opt.batch_invariant ? 0 : cuda::fast_prefill_panel_bytes(*dm_));
  std::fprintf(stderr, "%s\n", dm_->report.c_str());
}

CudaBackend::~CudaBackend() {
  clear_graphs();
  if (plan_host_) cudaFreeHost(plan_host_);
}

size_t CudaBackend::bytes_per_slot(const CacheShape& shape) const {
  return make_state_layout(m_.config, 1, shape.max_ctx, 2).bytes_per_slot;
}

void CudaBackend::reserve(const CacheShape& shape) {
  const Config& c = m_.config;
  check_reserve(shape, c);
  CM_CUDA(cudaStreamSynchronize(ctx_->stream()));
  clear_graphs();  // they point into the buffers this reservation replaces
  // Drop the old buffers first so their memory counts as free.
  shape_ = CacheShape{0, 0, 0};
  state_.release();
  act_ = Act{};
  moe_scratch_.reset();
  if (plan_host_) CM_CUDA(cudaFreeHost(plan_host_));
  plan_host_ = nullptr;

  const int64_t N = shape.max_step_tokens, S = shape.max_slots, D = c.hidden_size, hc = c.hc_mult;
  const int64_t H = c.num_heads, hd = c.head_dim, E = c.n_routed_experts, K = c.n_experts_per_tok;
  const int64_t I = c.moe_inter, ih = c.index_head_dim, inh = c.index_n_heads, G = c.o_groups, ol = c.o_lora_rank;
  const StateLayout layout = make_state_layout(c, S, shape.max_ctx, 2);
  int64_t max_ie = 1;
  for (const LayerStateLayout& ll : layout.layers)
    if (ll.index.present()) max_ie = std::max(max_ie, ll.index.max_entries);
  const bool dense_moe = std::any_of(dm_->layers.begin(), dm_->layers.end(),
                                     [](const cuda::DevLayer& l) { return !l.experts; });
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
  max_notes_ = size_t(2 + 16 * c.num_layers);
  const int64_t max_k = std::max({D, c.q_lora_rank, H * hd, G * ol, I});
  // Every activation buffer: name, bytes.
  struct Want {
    DeviceBuffer* buf;
    int64_t bytes;
  };
  Act& a = act_;
  const std::vector<Want> wants = {
      {&a.plan, 4 * N * 4},           {&a.x, N * hc * D * 4},        {&a.x_alt, N * hc * D * 4},
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
      {&a.logits, N * c.vocab_size * 4}, {&a.cast, N * max_k * 2},   {&a.counts, int64_t(max_notes_) * N * 4},
      {&a.hc_part, int64_t(hc_mix_scratch_floats(hc, D, N)) * 4},
      {&a.attn_ws, attn_ws_floats * 4},
  };
  size_t act_bytes = 0;
  for (const Want& w : wants) act_bytes += size_t(w.bytes);
  const size_t state_bytes = layout.bytes;
  const cuda::DevLayer* packed = nullptr;
  for (const cuda::DevLayer& l : dm_->layers)
    if (l.experts) packed = &l;
  const size_t moe_bytes = packed ? size_t(N * K) * size_t(2 * I + 4 * D + 8) + size_t(E) * 64 : 0;
  // The whole backend against the budget: what it holds (weights, Context) plus this reservation,
  // with 64 MiB to spare for the CUDA runtime.
  const size_t held = dm_->total_bytes + ctx_->device_bytes();
  const size_t work = act_bytes + moe_bytes + obs_.reserve_bytes() + ctx_->device_bytes() + (size_t(64) << 20);
  cuda::check_memory(cuda::memory_budget(opt_.gpu_memory_utilization, held), dm_->total_bytes + state_bytes + work,
                     cuda::strf("weights %s, per-slot state %s for %lld slots of %lld tokens, activations and "
                                "workspaces %s for %lld-token steps",
                                gib(dm_->total_bytes).c_str(), gib(state_bytes).c_str(), (long long)S,
                                (long long)shape.max_ctx, gib(work).c_str(), (long long)N));

  for (const Want& w : wants) w.buf->alloc(size_t(std::max<int64_t>(w.bytes, 4)));
  if (packed) moe_scratch_ = std::make_unique<cuda::MoeScratch>(*packed->experts, int(N), int(K));
  state_.alloc(std::max<size_t>(state_bytes, 4));
  state_.zero();
  a.counts.zero();
  obs_.reserve();
  CM_CUDA(cudaMallocHost(reinterpret_cast<void**>(&plan_host_), size_t(4 * N) * 4));

  // Per-layer state views into the shared layout (slot-major tensors).
  layout_ = layout;
  layers_.assign(size_t(c.num_layers), LayerState{});
  void* base = state_.get();
  auto comp = [&](CompressorStateView& v, const CompressorLayout& cl) {
    v.ratio = cl.ratio, v.c = cl.c, v.dc = cl.dc, v.max_slots = S, v.max_entries = cl.max_entries;
    v.pend_kv = layout_.at<float>(base, cl.pend_kv, 0);
    v.pend_gate = layout_.at<float>(base, cl.pend_gate, 0);
    v.entries = layout_.at<uint16_t>(base, cl.entries, 0);
  };
  for (int64_t L = 0; L < c.num_layers; ++L) {
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
  shape_ = shape;
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
}

void CudaBackend::copy_slot(int32_t from, int32_t to) {
  check_slot(from, "copy_slot");
  check_slot(to, "copy_slot");
  if (from == to) return;
  char* base = static_cast<char*>(state_.get());
  for (const StateTensor& t : layout_.tensors)
    CM_CUDA(cudaMemcpyAsync(base + t.slot_offset(to), base + t.slot_offset(from), t.slot_bytes(),
                            cudaMemcpyDeviceToDevice, ctx_->stream()));
  CM_CUDA(cudaStreamSynchronize(ctx_->stream()));
  pos_[size_t(to)] = pos_[size_t(from)];
}

void CudaBackend::linear(const DevLinear& w, const void* x, bool x_bf16, int64_t M, void* y, int64_t ldx,
                         int64_t ldy) {
  cuda::run_linear(*ctx_, w, x, x_bf16, M, ldx ? ldx : w.K * w.groups, y, false, ldy ? ldy : w.N,
                   P<uint16_t>(act_.cast), opt_.batch_invariant);
  if (timer_) mark(op_label(w.name));
}

// Queues the intermediate for counting its non-finite values per row (flush_counts); with an observer, hands
// each slot's rows over as "l<L>.s<slot>.<what>" (device_observer.h).
void CudaBackend::note(const char* what, int64_t layer, const void* data, bool bf16, int64_t width,
                       const std::vector<int64_t>& inner) {
  if (notes_.size() < max_notes_) {
    // Counted later, together (flush_counts): the buffer must stay unchanged until the next flush.
    cuda::NonFiniteBatch& b = pending_counts_;
    b.x[b.count] = data;
    b.width[b.count] = width;
    b.bf16[b.count] = bf16;
    b.out[b.count] = P<int32_t>(act_.counts) + int64_t(notes_.size()) * shape_.max_step_tokens;
    ++b.count;
    notes_.push_back(NoteTag{what, layer});
    if (b.count == cuda::NonFiniteBatch::kMax) flush_counts();
  }
  if (!obs_.active()) return;
  std::vector<int64_t> shape{0};
  shape.insert(shape.end(), inner.begin(), inner.end());
  const size_t esize = bf16 ? 2 : 4;
  for (const Segment& s : plan_) {
    shape[0] = s.n;
    obs_.observe(*ctx_, note_name(what, layer, s.slot),
                 static_cast<const char*>(data) + size_t(s.row0 * width) * esize, bf16, shape);
  }
}

// Counts the non-finite values of the intermediates noted since the last flush, in one launch. The
// step flushes before it overwrites a noted buffer: after the embedding, after each layer (the two
// halves write their own buffers; the next layer rewrites them) and when the batch is full.
void CudaBackend::flush_counts() {
  if (pending_counts_.count == 0) return;
  cuda::count_non_finite(*ctx_, pending_counts_, n_);
  pending_counts_.count = 0;
  mark("count_non_finite");
}

// Observer only: per segment, the entries (and CSA index keys) this step completed, as the CPU names them.
void CudaBackend::observe_entries(int64_t L, const CompressorStateView& comp, const CompressorStateView* index) {
  if (!obs_.active()) return;
  for (const Segment& s : plan_) {
    for (const CompressorStateView* st : {&comp, index}) {
      if (!st) continue;
      const int64_t first = s.pos0 / st->ratio, n_new = (s.pos0 + s.n) / st->ratio - first;
      if (n_new <= 0) continue;
      obs_.observe(*ctx_, note_name(st == index ? "index_keys" : "entries", L, s.slot),
                   st->entries + (int64_t(s.slot) * st->max_entries + first) * st->dc, true, {n_new, st->dc});
    }
  }
}

void CudaBackend::step(const Batch& b, float* logits_out) {
  const Config& c = m_.config;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, V = c.vocab_size, n = b.n, N = shape_.max_step_tokens;
  check_batch(b, shape_, V, pos_.data());

  // The plan: the batch's rows and the rows whose logits are wanted, one transfer.
  plan_.build(b);
  const int64_t R = plan_.n_logits, max_pos = plan_.max_pos;
  std::copy(b.token, b.token + n, plan_host_);
  std::copy(b.pos, b.pos + n, plan_host_ + N);
  std::copy(b.slot, b.slot + n, plan_host_ + 2 * N);
  std::copy(plan_.logit_rows.begin(), plan_.logit_rows.begin() + R, plan_host_ + 3 * N);
  n_ = n;
  if (timer_) timer_->begin(ctx.stream());
  CM_CUDA(cudaMemcpyAsync(act_.plan.get(), plan_host_, size_t(4 * N) * 4, cudaMemcpyHostToDevice, ctx.stream()));
  mark("plan upload");
  notes_.clear();
  pending_counts_.count = 0;
  obs_.begin_step();

  // Graphs unless something watches the individual kernels (an observer; the op timer's per-op
  // events — its SPAN mode times the whole step from outside the graph).
  const bool per_op = timer_ && timer_->mode() == cuda::OpTimer::Mode::OPS;
  const bool graph = opt_.cuda_graphs && !obs_.active() && !per_op && n <= kGraphMaxRows;
  if (!graph || !run_graph(n, R)) forward(n, R, max_pos);
  for (const Segment& s : plan_) pos_[size_t(s.slot)] = s.pos0 + s.n;

  // The logits rows to the host (the step's only synchronisation), then the non-finite check.
  if (timer_) timer_->end(ctx.stream());
  if (R > 0) {
    float *y = P<float>(act_.final_y), *logits = P<float>(act_.logits);
    obs_.observe(ctx, "final_norm", y, false, {R, D});
    obs_.observe(ctx, "logits", logits, false, {R, V});
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

void CudaBackend::forward(int64_t n, int64_t R, int64_t max_pos) {
  const Config& c = m_.config;
  const cuda::DevModel& w = *dm_;
  Context& ctx = *ctx_;
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  // Embedding, copied into every hyper-connection stream.
  float* X = P<float>(act_.x);
  embed_rows_cuda(ctx, w.embed, d_token_, n, hc, X);
  mark("embed");
  note("embed", -1, X, false, hc * D, {hc, D});
  flush_counts();  // (layer 0's MoE half rewrites X)

  // Per half layer two mHC kernels: the previous half's hc_post fused with this half's hc_pre partial
  // sums (over the streams it writes, out of place: x → x_alt → x), and hc_pre's finishing kernel fused
  // with the RMSNorm, which also writes the normed rows' bf16 copy for the FP8/NVFP4 linears. The bits
  // are those of hc_post, hc_pre, rms_norm and the casts run apart (ops/hc.h), and every noted buffer
  // holds what it held: X (= act_.x) after each layer, normed after each norm. The two halves read and
  // write their own normed and out, so a layer's intermediates are counted in one launch at its end.
  float *X1 = P<float>(act_.x_alt), *normed = P<float>(act_.normed), *out = P<float>(act_.out);
  float *normed_ffn = P<float>(act_.normed_ffn), *out_ffn = P<float>(act_.out_ffn);
  float *post = P<float>(act_.post), *comb = P<float>(act_.comb), *part = P<float>(act_.hc_part);
  uint16_t* normed_bf = P<uint16_t>(act_.normed_bf);
  auto norm_out = [&](const cuda::DevF32& w, float* y) { return HcNormOut{w.p(), c.rms_norm_eps, y, normed_bf}; };
  for (int64_t L = 0; L < c.num_layers; ++L) {
    const cuda::DevLayer& lw = w.layers[size_t(L)];
    const HcParams attn_hc = hc_params(c, lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale);
    const HcParams ffn_hc = hc_params(c, lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale);
    // Layer 0's partial sums here; every later layer's came with the previous layer's last hc_post.
    hc_pre_norm_cuda(ctx, attn_hc, X, n, nullptr, post, comb, part, norm_out(lw.attn_norm, normed), L > 0);
    mark("hc_pre+rms_norm");
    note("attn_in", L, normed, false, D, {D});
    attention(L, n, max_pos);
    note("attn_out", L, out, false, D, {D});
    hc_post_mix_cuda(ctx, hc, D, out, post, comb, n, X, X1, &ffn_hc, part);
    mark("hc_post+hc_pre partials");

    hc_pre_norm_cuda(ctx, ffn_hc, X1, n, nullptr, post, comb, part, norm_out(lw.ffn_norm, normed_ffn), true);
    mark("hc_pre+rms_norm");
    note("moe_in", L, normed_ffn, false, D, {D});
    moe(L, n);
    note("moe_out", L, out_ffn, false, D, {D});
    if (L + 1 < c.num_layers) {
      const cuda::DevLayer& next = w.layers[size_t(L + 1)];
      const HcParams next_hc = hc_params(c, next.hc_attn_fn, next.hc_attn_base, next.hc_attn_scale);
      hc_post_mix_cuda(ctx, hc, D, out_ffn, post, comb, n, X1, X, &next_hc, part);
      mark("hc_post+hc_pre partials");
    } else {
      hc_post_mix_cuda(ctx, hc, D, out_ffn, post, comb, n, X1, X, nullptr, nullptr);
      mark("hc_post");
    }
    note("resid", L, X, false, hc * D, {hc, D});
    flush_counts();
  }
  flush_counts();  // (each layer flushed its own; this covers a model without layers)

  // Final hyper-head and norm (one finishing kernel; the bf16 copy for a quantized head) and the LM
  // head over the rows whose logits are wanted.
  if (R > 0) {
    float *head_in = X1, *y = P<float>(act_.final_y), *logits = P<float>(act_.logits);
    cuda::gather_rows(ctx, X, d_rows_, R, hc * D, head_in);
    HcHeadParams hp{w.hc_head_fn.p(), w.hc_head_base.p(), w.hc_head_scale.p(), hc, D, c.hc_eps, c.rms_norm_eps};
    hc_head_norm_cuda(ctx, hp, head_in, R, part, HcNormOut{w.norm.p(), c.rms_norm_eps, y, normed_bf});
    mark("hc_head+rms_norm");
    linear2(w.head, y, normed_bf, R, logits);
  }
}

void CudaBackend::clear_graphs() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

bool CudaBackend::run_graph(int64_t n, int64_t R) {
  cudaStream_t st = ctx_->stream();
  const int64_t all_pos = shape_.max_ctx - 1;  // the indexer's grid covers every entry the slots can hold
  auto it = graphs_.find({n, R});
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) return false;  // an unusual mix of step shapes
    CM_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t g = nullptr;
    try {
      forward(n, R, all_pos);
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
    it = graphs_.emplace(std::make_pair(n, R), StepGraph{exec, notes_}).first;
  } else {
    notes_ = it->second.notes;  // what the replayed kernels count, for first_non_finite
  }
  CM_CUDA(cudaGraphLaunch(it->second.exec, st));
  return true;
}

// The first counted intermediate with a non-finite value, named for the slot of its first bad row.
std::string CudaBackend::first_non_finite() {
  const int64_t N = shape_.max_step_tokens;
  std::vector<int32_t> counts(notes_.size() * size_t(N));
  obs_.to_host(*ctx_, counts.data(), act_.counts.get(), counts.size() * 4);
  for (size_t i = 0; i < notes_.size(); ++i)
    for (const Segment& s : plan_)
      for (int64_t r = s.row0; r < s.row0 + s.n; ++r)
        if (counts[i * size_t(N) + size_t(r)] > 0)
          return note_name(notes_[i].what, notes_[i].layer, s.slot);
  return "the LM head";
}

// The attention block of layer L over the step's rows (normed → out); the
// order and math of model/attention.cpp.
void CudaBackend::attention(int64_t L, int64_t n, int64_t max_pos) {
  const Config& c = m_.config;
  const cuda::DevLayer& lw = dm_->layers[size_t(L)];
  LayerState& ls = layers_[size_t(L)];
  Context& ctx = *ctx_;
  Act& a = act_;
  const AttnKind kind = c.attn_kinds[size_t(L)];
  const RopeView& rope = kind == AttnKind::SLIDING ? dm_->rope_main : dm_->rope_compress;
  const int64_t H = c.num_heads, hd = c.head_dim, W = c.sliding_window, G = c.o_groups, ol = c.o_lora_rank;
  const int64_t ql = c.q_lora_rank, inh = c.index_n_heads, ihd = c.index_head_dim, topk = c.index_topk;
  const float eps = c.rms_norm_eps;
  // normed and qr come with their bf16 copies (written by their norms) for the FP8/NVFP4 linears.
  const float* normed = P<float>(a.normed);
  const uint16_t* normed_bf = P<uint16_t>(a.normed_bf);
  uint16_t* qr_bf = P<uint16_t>(a.qr_bf);

  // Queries and the shared KV head, for every row of the step.
  float *qr = P<float>(a.qr), *qf = P<float>(a.qf), *kvf = P<float>(a.kvf);
  uint16_t *q = P<uint16_t>(a.q_bf), *kv = P<uint16_t>(a.kv_bf);
  // q_a and kv at decode: one launch for both (run_linear_pair: each output with its own launch's bits).
  if (cuda::run_linear_pair(ctx, lw.wq_a, lw.wkv, normed_bf, n, qr, kvf)) {
    mark("attn.wq_a+wkv");
  } else {
    linear2(lw.wq_a, normed, normed_bf, n, qr);
    linear2(lw.wkv, normed, normed_bf, n, kvf);
  }
  rms_norm_cuda(ctx, qr, lw.q_norm.p(), n, ql, eps, qr, false, nullptr, nullptr, 1, qr_bf);
  mark("rms_norm");
  linear2(lw.wq_b, qr, qr_bf, n, qf);
  // The per-head Q norm + RoPE and the KV norm + RoPE (rows of hd both) in one launch.
  rms_norm2_cuda(ctx, RmsNormJob{qf, nullptr, n * H, hd, eps, q, true, &rope, d_pos_, H},
                 RmsNormJob{kvf, lw.kv_norm.p(), n, hd, eps, kv, true, &rope, d_pos_, 1});
  mark("rms_norm+rope (q, kv)");
  note("q", L, q, true, H * hd, {H, hd});
  note("kv", L, kv, true, hd, {hd});

  // Compressed entries per slot (and, for CSA, the indexer's keys and choice).
  const int64_t m = c.ratio(L);
  if (lw.comp) {
    float *ckv = P<float>(a.ckv), *cgate = P<float>(a.cgate);
    linear2(lw.comp->wkv, normed, normed_bf, n, ckv);
    linear2(lw.comp->wgate, normed, normed_bf, n, cgate);
    compressor_step_cuda(ctx, ls.comp, lw.comp->ape.p(), lw.comp->norm.p(), eps, dm_->rope_compress, ckv, cgate,
                         d_slot_, d_pos_, n);
    mark("compressor_step");
  }
  if (kind == AttnKind::CSA) {
    float *ikv = P<float>(a.ikv), *igate = P<float>(a.igate), *iqf = P<float>(a.iqf), *iw = P<float>(a.iw);
    linear2(lw.index_comp->wkv, normed, normed_bf, n, ikv);
    linear2(lw.index_comp->wgate, normed, normed_bf, n, igate);
    linear2(lw.index_wq_b, qr, qr_bf, n, iqf);
    linear2(lw.index_weights_proj, normed, normed_bf, n, iw);
    compressor_step_cuda(ctx, ls.index, lw.index_comp->ape.p(), lw.index_comp->norm.p(), eps, dm_->rope_compress,
                         ikv, igate, d_slot_, d_pos_, n);
    mark("compressor_step (indexer)");
  }
  if (lw.comp) observe_entries(L, ls.comp, kind == AttnKind::CSA ? &ls.index : nullptr);
  if (kind == AttnKind::CSA) {
    float *iqf = P<float>(a.iqf), *iw = P<float>(a.iw), *iscore = P<float>(a.iscore);
    float* sel_score = P<float>(a.sel_score);
    uint16_t* iq = P<uint16_t>(a.iq_bf);
    int32_t* sel = P<int32_t>(a.sel);
    // Lightning indexer: top-k causal entries by Σ_h w_h·ReLU(q_h·K_i)·ihd^−½, w scaled by inh^−½.
    rope_cuda(ctx, iqf, false, iq, true, n * inh, ihd, d_pos_, inh, dm_->rope_compress, false);
    mark("rope (indexer)");
    cuda::scale_f32(ctx, iw, n * inh, 1.0f / std::sqrt(float(inh)));
    mark("scale");
    const int64_t ld = ls.index.max_entries;
    indexer_scores_cuda(ctx, ls.index, iq, iw, inh, d_slot_, d_pos_, n, std::min(ld, (max_pos + 1) / m), iscore, ld);
    mark("indexer_scores");
    topk_lower_index_first_cuda(ctx, iscore, ld, d_pos_, m, n, topk, sel);
    mark("indexer_topk");
    cuda::gather_scores(ctx, iscore, ld, sel, n, topk, sel_score);
    mark("gather_scores");
    note("index_top_scores", L, sel_score, false, topk, {topk});
  }

  // Attention per query token over its slot's window rows ∪ compressed entries.
  uint16_t* o = P<uint16_t>(a.o_bf);
  AttnInputs in;
  in.kv = kv;
  in.window = ls.window;
  in.W = W;
  in.sinks = lw.sinks.p();
  in.workspace = P<float>(a.attn_ws);
  in.workspace_floats = int64_t(a.attn_ws.size() / 4);
  if (kind != AttnKind::SLIDING) {
    in.entries = ls.comp.entries;
    in.max_entries = ls.comp.max_entries;
    in.ratio = m;
    if (kind == AttnKind::CSA) {
      in.sel = P<int32_t>(a.sel);
      in.topk = topk;
    }
  }
  attention_sink_cuda(ctx, in, q, H, hd, 1.0f / std::sqrt(float(hd)), rope, d_slot_, d_pos_, n, o);
  mark(kind == AttnKind::SLIDING ? "attention (window)" : kind == AttnKind::CSA ? "attention (CSA)" : "attention (HCA)");
  note("attn_core", L, o, true, H * hd, {H, hd});
  // The window ring keeps each slot's last W rows for the next step.
  window_store_cuda(ctx, kv, ls.window, W, hd, d_slot_, d_pos_, n);
  mark("window_store");

  // Grouped low-rank output projection (group g's heads through rows [g·ol, (g+1)·ol) of wo_a), then wo_b.
  // For an FP8/NVFP4 wo_b, wo_a writes bf16: the bits of its f32 output cast (every such kernel stores
  // the round-to-nearest-even of its f32 value), without the cast kernel.
  const bool ub = lw.wo_a.wants_bf16_input() && lw.wo_b.wants_bf16_input();
  void* u = ub ? static_cast<void*>(P<uint16_t>(a.u_bf)) : static_cast<void*>(P<float>(a.u));
  cuda::run_linear(ctx, lw.wo_a, o, true, n, H * hd, u, ub, G * ol, P<uint16_t>(a.cast), opt_.batch_invariant);
  if (timer_) mark(op_label(lw.wo_a.name));
  linear(lw.wo_b, u, ub, n, P<float>(a.out));
}

// y = w2 · (silu(min(w1·x, L)) ⊙ clamp(w3·x, −L, L)) for n rows (f32 x and y).
// x_bf: the bf16 copy of x (for FP8/NVFP4 w1, w3).
void CudaBackend::expert(const cuda::DevExpert& e, const float* x, const uint16_t* x_bf, int64_t n, float* y) {
  const int64_t I = e.w1.N;
  float *g = P<float>(act_.g), *up = P<float>(act_.up);
  // w1 and w3 share their input: one decode launch for both (each output with its own launch's bits).
  if (!x_bf || !cuda::run_linear_pair(*ctx_, e.w1, e.w3, x_bf, n, g, up)) {
    linear2(e.w1, x, x_bf, n, g);
    linear2(e.w3, x, x_bf, n, up);
  } else {
    mark("w1+w3");
  }
  // SwiGLU writes bf16 for an FP8/NVFP4 w2 (the bits of the cast its f32 output would get).
  const bool hb = e.w2.wants_bf16_input();
  void* h = hb ? static_cast<void*>(P<uint16_t>(act_.h_bf)) : static_cast<void*>(g);
  swiglu_cuda(*ctx_, g, up, I, n, I, m_.config.swiglu_limit, nullptr, h, hb);
  mark("swiglu");
  linear(e.w2, h, hb, n, y);
}

// The MoE block of layer L (normed → out): router, routed experts, shared expert (model/moe.cpp).
void CudaBackend::moe(int64_t L, int64_t n) {
  const Config& c = m_.config;
  const cuda::DevLayer& lw = dm_->layers[size_t(L)];
  Context& ctx = *ctx_;
  Act& a = act_;
  const int64_t D = c.hidden_size, E = c.n_routed_experts, K = c.n_experts_per_tok;
  const float* normed = P<float>(a.normed_ffn);
  const uint16_t* normed_bf = P<uint16_t>(a.normed_bf);  // written by the ffn norm
  float *router = P<float>(a.router), *ew = P<float>(a.ew), *routed = P<float>(a.routed), *out = P<float>(a.out_ffn);
  int32_t* eidx = P<int32_t>(a.eidx);

  linear2(lw.gate, normed, normed_bf, n, router);
  note("router_logits", L, router, false, E, {E});
  RouterParams rp;
  rp.experts = E;
  rp.topk = K;
  rp.routed_scaling = float(c.routed_scaling_factor);
  rp.bias = lw.gate_bias.buf.size() ? lw.gate_bias.p() : nullptr;
  rp.tid2eid = lw.tid2eid.size() ? lw.tid2eid.as<const int32_t>() : nullptr;
  rp.vocab = c.vocab_size;
  route_cuda(ctx, rp, d_token_, router, n, eidx, ew);
  mark("route");

  if (lw.experts) {
    // Packed FP4 experts (on the norm's bf16 copy): routing lists, gate/up + SwiGLU, down, k-ordered
    // combine on the device.
    cuda::moe_nvfp4(ctx, *lw.experts, *moe_scratch_, normed_bf, int(n), eidx, ew, routed);
    mark("moe_nvfp4 (routed experts)");
  } else {
    // Experts as separate linears: each over every row, added with the row's weight for it
    // (0 when not chosen) in ascending expert order, as the CPU sums.
    float *we = P<float>(a.we), *ey = P<float>(a.ey);
    cuda::moe_expert_weights(ctx, eidx, ew, n, K, E, we);
    CM_CUDA(cudaMemsetAsync(routed, 0, size_t(n * D) * 4, ctx.stream()));
    mark("moe_expert_weights");
    for (int64_t e = 0; e < E; ++e) {
      expert(lw.dense_experts[size_t(e)], normed, normed_bf, n, ey);
      cuda::axpy_rows(ctx, we + e * n, ey, n, D, routed);
      mark("axpy_rows");
    }
  }
  note("moe_routed", L, routed, false, D, {D});
  if (lw.has_shared) {
    float* sy = P<float>(a.sy);
    expert(lw.shared, normed, normed_bf, n, sy);
    note("moe_shared", L, sy, false, D, {D});
    cuda::add_f32(ctx, routed, sy, n * D, out);
  } else {
    CM_CUDA(cudaMemcpyAsync(out, routed, size_t(n * D) * 4, cudaMemcpyDeviceToDevice, ctx.stream()));
  }
  mark("add");
}

bool cuda_backend_available() { return cuda::device_count() > 0; }

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
