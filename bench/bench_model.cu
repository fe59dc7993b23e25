// The synthetic-model benchmark (see bench_model.h): building the model on the
// device, fitting the layer count, and timing prefill and decode steps through
// the engine seam.
#include "bench/bench_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/core/op_timer.h"
#include "common/error.h"
#include "backend/step_plan.h"
#include "ops/compressor.h"

namespace cm::cuda {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = double(size_t(1) << 30);

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

size_t free_bytes() {
  size_t f = 0, t = 0;
  CM_CUDA(cudaMemGetInfo(&f, &t));
  return f;
}

// Bytes of one routed expert in the packed layout (data + scales of w1, w3, w2).
size_t packed_expert_bytes(int64_t D, int64_t I) { return size_t(3) * size_t(D * I / 2 + D * I / 16); }

// Device-to-device copy of 1 GiB, timed with events: bytes read + written per second (median of 5).
double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer a(bytes), b(bytes);
  CM_CUDA(cudaMemset(a.get(), 1, bytes));
  cudaEvent_t e0, e1;
  CM_CUDA(cudaEventCreate(&e0));
  CM_CUDA(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int i = 0; i < 7; ++i) {
    CM_CUDA(cudaEventRecord(e0));
    CM_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
    CM_CUDA(cudaEventRecord(e1));
    CM_CUDA(cudaEventSynchronize(e1));
    float t = 0;
    CM_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * double(bytes) / (median(ms) * 1e-3) / 1e9;
}

// The backend's per-slot state of layer L at max_ctx (the layout both backends share, bf16 rows), for
// the layer fit.
size_t state_bytes_layer(const Config& c, int64_t L, int64_t max_ctx) {
  const StateLayout l = make_state_layout(c, 1, max_ctx, 2);
  size_t b = 0;
  for (const StateTensor& t : l.tensors)
    if (t.layer == L) b += t.slot_bytes();
  return b;
}

// Activation bytes per step row (an estimate of the backend's buffers: logits, streams, queries, MoE scratch).
size_t act_bytes_per_row(const Config& c, int64_t max_ctx) {
  const int64_t D = c.hidden_size, hc = c.hc_mult, Hh = c.num_heads * c.head_dim, I = c.moe_inter;
  const int64_t K = c.n_experts_per_tok;
  const int64_t per = c.vocab_size * 4 + 2 * hc * D * 4 + 8 * D * 4 + Hh * (4 + 2 + 2 + 2) + c.o_groups * c.o_lora_rank * 4 +
                      c.index_n_heads * c.index_head_dim * 6 + (max_ctx / 4) * 4 + c.n_routed_experts * 4 + 2 * I * 4 +
                      K * (2 * I + 4 * D + 8) + 2 * D + (2 + 16 * c.num_layers) * 4;
  return size_t(per);
}

// The dense (non-routed-expert) stored bytes of a layer as the synthetic builder makes it.
size_t dense_stored_bytes(const LayerWeights& lw) {
  size_t b = 0;
  auto add = [&](const LinearWeight& w) { b += w.stored_bytes(); };
  add(lw.wq_a), add(lw.wq_b), add(lw.wkv), add(lw.wo_a), add(lw.wo_b), add(lw.gate);
  for (const CompressorWeights* cw : {lw.compressor.get(), lw.indexer ? &lw.indexer->comp : nullptr})
    if (cw) add(cw->wkv), add(cw->wgate), b += (cw->ape.size() + cw->norm.size()) * 4;
  if (lw.indexer) add(lw.indexer->wq_b), add(lw.indexer->weights_proj);
  add(lw.shared.w1), add(lw.shared.w2), add(lw.shared.w3);
  b += lw.tid2eid.size() * 4 + (lw.hc_attn.fn.size() + lw.hc_ffn.fn.size()) * 4;
  return b;
}

void progress(const std::string& s) {
  std::fprintf(stderr, "bench model: %s\n", s.c_str());
  std::fflush(stderr);
}

}  // namespace

SyntheticDevice::SyntheticDevice() = default;
SyntheticDevice::~SyntheticDevice() = default;

std::unique_ptr<DevModel> synthetic_dev_model(const Config& c, uint64_t seed, bool mtp, SyntheticDevice* sd) {
  CM_CU_CHECK(device_count() > 0, "synthetic model: no CUDA device is present");
  const int64_t D = c.hidden_size, I = c.moe_inter, E = c.n_routed_experts;
  CM_CU_CHECK(D % 64 == 0 && I % 64 == 0,
              "synthetic model: hidden %lld and moe_intermediate %lld must be multiples of 64", (long long)D,
              (long long)I);
  auto dm = std::make_unique<DevModel>();
  MtpWeights mw;  // (with mtp) the MTP block's small pieces taken from the globals
  {  // Embedding and head on the host only while they upload.
    auto host = synthetic_model_shell(c);
    host->weights = synthetic_globals(c, seed);
    upload_globals(*host, *dm);
    const Weights& w = host->weights;
    mw.enorm = mw.hnorm = mw.norm = w.norm;
    mw.hc_head_fn = w.hc_head_fn, mw.hc_head_base = w.hc_head_base, mw.hc_head_scale = w.hc_head_scale;
    if (sd) sd->head_bytes = dm->head.bytes();
  }
  if (sd) sd->expert_bytes = packed_expert_bytes(D, I);
  for (int64_t L = 0; L < c.num_layers; ++L) {
    const size_t need = packed_expert_bytes(D, I) * size_t(E) + (size_t(512) << 20);
    const size_t have = free_bytes();
    CM_CU_CHECK(need <= have,
                "synthetic model: layer %lld needs about %.2f GiB of device memory, %.2f GiB free (keep fewer "
                "layers: --num-layers, bench --layers)",
                (long long)L, double(need) / kGiB, double(have) / kGiB);
    const size_t before = dm->bytes.total();
    {
      LayerWeights lw = synthetic_layer(c, L, seed, false);
      upload_layer(c, lw, *dm, L);
    }  // the host layer is freed here
    DevLayer& dl = dm->layers[size_t(L)];
    // A decode step reads all of these but the hash table (B of its rows).
    if (sd) sd->dense_layer_bytes.push_back(dm->bytes.total() - before - dl.tid2eid.size());
    dl.experts = std::make_unique<DeviceExperts>(random_experts(D, I, 0, int(E), seed * 1000003 + uint64_t(L)));
    dl.experts->swiglu_limit = c.swiglu_limit > 0 ? c.swiglu_limit : INFINITY;
    // Tensor scales that give the random codes an rms of about 1/sqrt(K) (random_experts' block
    // scales have an rms near 3.3, E2M1 codes 2.93), so activations stay finite through every layer.
    std::vector<float> s2(size_t(E) * 3);
    for (int64_t e = 0; e < E; ++e) {
      s2[size_t(3 * e)] = s2[size_t(3 * e + 1)] = float(1.0 / (2.93 * 3.3 * std::sqrt(double(D))));
      s2[size_t(3 * e + 2)] = float(1.0 / (2.93 * 3.3 * std::sqrt(double(I))));
    }
    dl.experts->scale2.upload(s2.data(), s2.size() * 4);
    dm->bytes.experts += dl.experts->expert_bytes() * size_t(E) + dl.experts->scale2.size();
  }
  if (mtp) {  // the last layer's shape as a sliding-window, score-routed layer, with its own experts
    mw.block = synthetic_layer(c, c.num_layers - 1, seed + 77, false);
    mw.block.compressor.reset();
    mw.block.indexer.reset();
    mw.block.tid2eid.clear();
    if (mw.block.gate_bias.empty()) mw.block.gate_bias.assign(size_t(E), 0.0f);
    mw.e_proj = synthetic_fp8("mtp.0.e_proj.weight", D, D, seed + 78);
    mw.h_proj = synthetic_fp8("mtp.0.h_proj.weight", D, D, seed + 79);
    dm->mtp = upload_mtp(c, mw, dm->bytes);
    DevLayer& dl = dm->mtp->block;
    dl.experts = std::make_unique<DeviceExperts>(random_experts(D, I, 0, int(E), seed * 1000003 + 999));
    dl.experts->swiglu_limit = c.swiglu_limit > 0 ? c.swiglu_limit : INFINITY;
    DeviceExperts& ex = *dm->layers.back().experts;  // the same tensor scales as the layers'
    dl.experts->scale2.alloc(ex.scale2.size());
    CM_CUDA(cudaMemcpy(dl.experts->scale2.get(), ex.scale2.get(), ex.scale2.size(), cudaMemcpyDeviceToDevice));
  }
  finish_report(*dm);
  return dm;
}

std::unique_ptr<SyntheticDevice> make_synthetic_device(const SyntheticShape& shape, uint64_t seed,
                                                       bool batch_invariant, bool mtp, bool concurrent_branches) {
  CM_CU_CHECK(device_count() > 0, "bench model: no CUDA device is present");
  auto sd = std::make_unique<SyntheticDevice>();
  sd->model = synthetic_model_shell(synthetic_config(shape));
  const Config& c = sd->model->config;
  std::unique_ptr<DevModel> dm = synthetic_dev_model(c, seed, mtp, sd.get());
  progress(dm->report);
  const DevBytes& g = dm->bytes;
  const double nl = double(std::max<int64_t>(1, c.num_layers));
  auto group = [&](size_t b) { return nlohmann::json{{"total", b}, {"per_layer", double(b) / nl}}; };
  sd->bytes = {{"embedding_and_head", g.embed},    {"attention", group(g.attn)},
               {"compressors_and_indexers", group(g.comp)}, {"routed_experts", group(g.experts)},
               {"shared_experts", group(g.shared)}, {"routers", group(g.router)},
               {"norms_mhc_sinks_rope", group(g.small)}, {"total", g.total()}};
  sd->timer = std::make_unique<OpTimer>(size_t(96 * c.num_layers + 64));
  BackendOptions bo;
  bo.batch_invariant = batch_invariant;
  bo.concurrent_branches = concurrent_branches;
  sd->backend = make_cuda_backend(*sd->model, std::move(dm), sd->timer.get(), bo);
  return sd;
}

std::unique_ptr<ModelBackend> make_dummy_cuda_backend(const Model& m, const BackendOptions& bo, bool mtp,
                                                      uint64_t seed) {
  std::unique_ptr<DevModel> dm = synthetic_dev_model(m.config, seed, mtp);
  dm->report = "dummy weights (--load-format dummy): " + std::to_string(m.config.num_layers) + " layers" +
               (mtp ? " and the MTP block" : "") + " generated on the device; " + dm->report;
  return make_cuda_backend(m, std::move(dm), nullptr, bo);
}

namespace {

struct Bench {
  const ModelBenchOptions& o;
  Clock::time_point t0 = Clock::now();
  nlohmann::json out;
  SyntheticDevice* sd = nullptr;
  std::vector<int32_t> tok, pos, slot;
  std::vector<uint8_t> want;
  std::vector<float> logits;
  uint64_t rng = 0x1234567;

  bool out_of_time(const std::string& what) {
    if (o.max_seconds <= 0 || seconds_since(t0) < o.max_seconds) return false;
    out["skipped"].push_back(strf("%s: skipped, the %.0f s budget (--max-seconds) was spent", what.c_str(),
                                  o.max_seconds));
    progress("skipped " + what + " (time budget)");
    return true;
  }
  void save() {
    if (o.json_file.empty()) return;
    std::ofstream f(o.json_file);
    CM_CU_CHECK(bool(f), "bench model: cannot write --json-file '%s'", o.json_file.c_str());
    f << out.dump(2) << "\n";
  }
  // reserve() with step rows halved (down to min_rows) while the device lacks the memory; the rows it got.
  int64_t reserve_shrinking(int32_t slots, int64_t rows, int64_t ctx, int64_t min_rows) {
    for (;;) {
      try {
        sd->backend->reserve(CacheShape{slots, int32_t(rows), ctx});
        return rows;
      } catch (const Error& e) {
        if (rows / 2 < min_rows) throw;
        out["notes"]["reserve"] = strf("%lld-row steps did not fit (%s); steps of %lld rows instead", (long long)rows,
                                       e.what(), (long long)(rows / 2));
        progress(out["notes"]["reserve"].get<std::string>());
        rows /= 2;
      }
    }
  }
  int32_t random_token() {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return int32_t(2 + (rng >> 33) % uint64_t(sd->model->config.vocab_size - 2));
  }
  // One step of n tokens for `slot` s continuing its positions (logits of the last row only).
  void prefill_step(int32_t s, int64_t n) {
    ModelBackend& be = *sd->backend;
    tok.resize(size_t(n)), pos.resize(size_t(n)), slot.assign(size_t(n), s), want.assign(size_t(n), 0);
    const int64_t p0 = be.slot_pos(s);
    for (int64_t i = 0; i < n; ++i) tok[size_t(i)] = random_token(), pos[size_t(i)] = int32_t(p0 + i);
    want[size_t(n - 1)] = 1;
    logits.resize(size_t(sd->model->config.vocab_size));
    be.step(Batch{int32_t(n), tok.data(), pos.data(), slot.data(), want.data()}, logits.data());
  }
  void prefill(int32_t s, int64_t tokens, int64_t chunk) {
    for (int64_t done = 0; done < tokens; done += chunk) prefill_step(s, std::min(chunk, tokens - done));
  }
  // One decode step: a token for each of slots [0, B), logits for every row.
  void decode_step(int64_t B) {
    ModelBackend& be = *sd->backend;
    tok.resize(size_t(B)), pos.resize(size_t(B)), slot.resize(size_t(B)), want.assign(size_t(B), 1);
    for (int64_t i = 0; i < B; ++i)
      tok[size_t(i)] = random_token(), slot[size_t(i)] = int32_t(i), pos[size_t(i)] = int32_t(be.slot_pos(int32_t(i)));
    if (o.sample_on_device) {
      be.step(Batch{int32_t(B), tok.data(), pos.data(), slot.data(), want.data()}, nullptr);
      params.resize(size_t(B));
      sampled.resize(size_t(B));
      sampled_lp.resize(size_t(B));
      for (int64_t i = 0; i < B; ++i) {
        SampleParams& p = params[size_t(i)];
        p.temperature = 1.0f, p.top_p = 0.95f, p.seed = uint64_t(i), p.counter = uint64_t(be.slot_pos(int32_t(i)));
      }
      StepSampling s;
      s.params = params.data(), s.token = sampled.data(), s.logprob = sampled_lp.data();
      be.sample_last_step(s);
      return;
    }
    logits.resize(size_t(B * sd->model->config.vocab_size));
    be.step(Batch{int32_t(B), tok.data(), pos.data(), slot.data(), want.data()}, logits.data());
  }
  // An MTP verify step: 1 + K random tokens for each of slots [0, B), every row sampled (on the device with
  // --sample-on-device, as the engine does; else its logits to the host), one undoable run per slot; then every slot keeps its first token
  // (rollback_slot), so the slots advance one position as in decode_step.
  void verify_step(int64_t B, int64_t K) {
    ModelBackend& be = *sd->backend;
    const int64_t n = B * (1 + K);
    tok.resize(size_t(n)), pos.resize(size_t(n)), slot.resize(size_t(n)), want.assign(size_t(n), 1);
    undo.assign(size_t(n), 1);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j <= K; ++j) {
        const size_t r = size_t(i * (1 + K) + j);
        tok[r] = random_token(), slot[r] = int32_t(i), pos[r] = int32_t(be.slot_pos(int32_t(i)) + j);
      }
    Batch b{int32_t(n), tok.data(), pos.data(), slot.data(), want.data()};
    b.undo = undo.data();
    if (o.sample_on_device) {  // every verify row drawn on the device (the engine's path since issue 26)
      be.step(b, nullptr);
      params.resize(size_t(n)), sampled.resize(size_t(n)), sampled_lp.resize(size_t(n));
      for (int64_t r = 0; r < n; ++r) {
        SampleParams& p = params[size_t(r)];
        p.temperature = 1.0f, p.top_p = 0.95f, p.seed = uint64_t(r), p.counter = uint64_t(pos[size_t(r)]);
      }
      StepSampling s;
      s.params = params.data(), s.token = sampled.data(), s.logprob = sampled_lp.data();
      be.sample_last_step(s);
    } else {
      logits.resize(size_t(n * sd->model->config.vocab_size));
      be.step(b, logits.data());
    }
    for (int64_t i = 0; i < B; ++i) be.rollback_slot(int32_t(i), be.slot_pos(int32_t(i)) - K);
  }
  // K drafts (greedy) for each of slots [0, B) from a random next token.
  void draft(int64_t B, int64_t K) {
    tok.resize(size_t(B)), slot.resize(size_t(B)), drafts.resize(size_t(B * K));
    for (int64_t i = 0; i < B; ++i) tok[size_t(i)] = random_token(), slot[size_t(i)] = int32_t(i);
    DraftRequest r;
    r.n = int32_t(B), r.slot = slot.data(), r.token = tok.data(), r.k = int32_t(K), r.out = drafts.data();
    sd->backend->draft(r);
  }
  std::vector<int32_t> drafts;
  std::vector<uint8_t> undo;
  std::vector<SampleParams> params;
  std::vector<int32_t> sampled;
  std::vector<float> sampled_lp;
};

// Expected distinct experts among B tokens each choosing K of E uniformly.
// The ten most expensive ops of one step run by `step` with a CUDA event after every op call:
// {"span_us", "ops": [{"op", "calls", "us", "share"}]}.
template <typename Step>
nlohmann::json top_ops(OpTimer& timer, Step&& step) {
  timer.set_mode(OpTimer::Mode::OPS);
  step();
  std::vector<OpTimer::OpTime> t = timer.totals();
  const double span = timer.span_ms();
  timer.set_mode(OpTimer::Mode::OFF);
  std::sort(t.begin(), t.end(), [](const OpTimer::OpTime& a, const OpTimer::OpTime& b) { return a.ms > b.ms; });
  nlohmann::json ops = nlohmann::json::array();
  for (size_t i = 0; i < t.size() && i < 10; ++i)
    ops.push_back({{"op", t[i].label}, {"calls", t[i].calls}, {"us", t[i].ms * 1e3}, {"share", t[i].ms / span}});
  return {{"span_us", span * 1e3}, {"ops", ops}};
}

double expected_experts(int64_t E, int64_t K, int64_t B) {
  return double(E) * (1.0 - std::pow(1.0 - double(K) / double(E), double(B)));
}

}  // namespace

nlohmann::json run_model_bench(const ModelBenchOptions& o) {
  CM_CU_CHECK(device_count() > 0, "bench model: no CUDA device is present");
  CM_CU_CHECK(o.repeats >= 1 && o.warmup >= 0, "bench model: --repeats must be >= 1");
  CM_CU_CHECK(o.prefill_chunk >= 1 && o.fill_chunk >= 1, "bench model: chunk sizes must be >= 1");
  for (int64_t b : o.batches) CM_CU_CHECK(b >= 1, "bench model: batch sizes must be >= 1, got %lld", (long long)b);
  for (int64_t x : o.contexts) CM_CU_CHECK(x >= 1, "bench model: contexts must be >= 1, got %lld", (long long)x);
  for (int64_t x : o.prefill) CM_CU_CHECK(x >= 1, "bench model: prefill lengths must be >= 1, got %lld", (long long)x);
  for (int64_t k : o.mtp)
    CM_CU_CHECK(k >= 1 && k <= kMaxDraft, "bench model: --mtp values must be in [1, %d], got %lld", int(kMaxDraft),
                (long long)k);
  Bench bn{o};
  nlohmann::json& out = bn.out;
  cudaDeviceProp prop{};
  CM_CUDA(cudaGetDeviceProperties(&prop, 0));
  out["gpu"] = prop.name;
  out["skipped"] = nlohmann::json::array();
  out["errors"] = nlohmann::json::array();
  const double copy_gbs = copy_bandwidth_gbs();
  out["copy_gbs"] = copy_gbs;
  progress(strf("device-to-device copy %.0f GB/s (read + write)", copy_gbs));

  // The layer count: as many of Flash's layers as fit next to the largest benchmark.
  const int64_t max_b = o.batches.empty() ? 1 : *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t max_c = o.contexts.empty() ? 1 : *std::max_element(o.contexts.begin(), o.contexts.end());
  const int64_t max_p = o.prefill.empty() ? 1 : *std::max_element(o.prefill.begin(), o.prefill.end());
  // Positions the decode (and MTP verify) steps add past each context, plus a verify run's drafts.
  const int64_t decode_margin =
      int64_t(o.batches.size() + o.mtp.size() * o.mtp_batches.size()) * (o.warmup + o.repeats + 2) + 8 + kMaxDraft;
  SyntheticShape shape = o.shape;
  {
    SyntheticShape all = shape;
    const Config c = synthetic_config(all);
    const int64_t decode_rows = std::max(o.fill_chunk, max_b), prefill_rows = std::min(o.prefill_chunk, max_p);
    const size_t expert = packed_expert_bytes(c.hidden_size, c.moe_inter) * size_t(c.n_routed_experts);
    const size_t globals = size_t(2 * c.vocab_size * c.hidden_size * 2);
    const size_t margin = size_t(4) << 30;
    // What the backend may use (its --gpu-memory-utilization budget, the default), not all that is free.
    const size_t free0 = memory_budget(BackendOptions{}.gpu_memory_utilization).available();
    int64_t fit = 0;
    size_t weights = globals, state_decode = 0, state_prefill = 0;
    const size_t act_decode = size_t(decode_rows) * act_bytes_per_row(c, max_c + decode_margin);
    const size_t act_prefill = size_t(prefill_rows) * act_bytes_per_row(c, max_p);
    std::vector<size_t> dense_by_kind(6, 0);  // (attention kind, hash or score routing): a layer's dense bytes
    for (int64_t L = 0; L < c.num_layers; ++L) {
      const size_t kind = size_t(c.attn_kinds[size_t(L)]) * 2 + (c.moe_kinds[size_t(L)] == MoeKind::HASH ? 1 : 0);
      if (!dense_by_kind[kind]) dense_by_kind[kind] = dense_stored_bytes(synthetic_layer(c, L, o.seed, false));
      const size_t w = dense_by_kind[kind] + expert;
      const size_t sdl = state_bytes_layer(c, L, max_c + decode_margin) * size_t(max_b);
      const size_t spl = state_bytes_layer(c, L, max_p);
      // The prefill and decode reservations never coexist (reserve() frees the previous one).
      const size_t need = weights + w + std::max(state_decode + sdl + act_decode, state_prefill + spl + act_prefill) +
                          margin;
      if (o.layers > 0 ? L >= o.layers : need > free0) break;
      weights += w, state_decode += sdl, state_prefill += spl, fit = L + 1;
    }
    const std::string arith = strf(
        "%.2f GiB available; embedding + head %.2f GiB; %lld layers of about %.2f GiB of weights each (%.2f GiB routed "
        "experts); state for the largest decode (%lld slots x %lld tokens) %.2f GiB + activations for its %lld-row "
        "steps about %.2f GiB (the prefill's %lld-row steps: %.2f GiB, not at the same time); %.0f GiB margin "
        "(workspace, allocator)%s",
        double(free0) / kGiB, double(globals) / kGiB, (long long)fit,
        fit ? double(weights - globals) / double(fit) / kGiB : 0.0, double(expert) / kGiB, (long long)max_b,
        (long long)(max_c + decode_margin), double(state_decode) / kGiB, (long long)decode_rows,
        double(act_decode) / kGiB, (long long)prefill_rows, double(act_prefill) / kGiB, double(margin) / kGiB,
        o.layers > 0 ? " (--layers given)" : "");
    // With --mtp, the MTP block takes a layer's weights (and its window) of what fit.
    if (!o.mtp.empty() && o.layers <= 0 && fit > 1) --fit;
    CM_CU_CHECK(fit >= 1, "bench model: not even one layer fits: %s", arith.c_str());
    if (o.layers > 0 && fit < o.layers) progress("V4-Flash has only " + std::to_string(fit) + " layers");
    out["layers_arithmetic"] = arith;
    progress(strf("layers: %lld (%s)", (long long)fit, arith.c_str()));
    shape.layers = fit;
    if (shape.ratios.size() > size_t(fit)) shape.ratios.resize(size_t(fit));
  }
  const double tb = seconds_since(bn.t0);
  auto sd = make_synthetic_device(shape, o.seed, !o.fast_prefill, !o.mtp.empty(), o.concurrent_branches);
  bn.sd = sd.get();
  const Config& c = sd->model->config;
  ModelBackend& be = *sd->backend;
  OpTimer& timer = *sd->timer;
  const int64_t NL = c.num_layers;
  progress(strf("built %lld layers on the device in %.1f s", (long long)NL, seconds_since(bn.t0) - tb));
  out["layers"] = NL;
  out["batch_invariant"] = !o.fast_prefill;
  out["concurrent_branches"] = o.concurrent_branches;
  out["sample_on_device"] = o.sample_on_device;
  if (o.fast_prefill) progress("--fast-prefill: steps over 256 rows run the quantized linears through cuBLAS");
  out["config"] = synthetic_config_json(shape);
  out["memory"] = {{"weights", sd->bytes}, {"dense_bytes_per_layer", sd->dense_layer_bytes}};
  for (int64_t ctx : o.contexts)
    out["memory"]["bytes_per_slot"][std::to_string(ctx)] = be.bytes_per_slot(CacheShape{1, 1, ctx});
  out["notes"] = {
      {"prefill", "one slot; a prompt of random tokens fed in steps of up to prefill_chunk tokens, logits of the "
                  "last row only; wall = host time of the steps (each ends in a device sync); tok_s = tokens / "
                  "median wall"},
      {"decode", "B slots each holding `context` tokens (slot 0 filled by prefill steps of fill_chunk tokens, the "
                 "others copy_slot copies of it), then steps of one random token per slot; step_ms = median host "
                 "wall time of a step (plan upload, every kernel, B x vocab fp32 logits copied to the host — with "
                 "--sample-on-device instead the sampling kernel and B x 12 bytes back —, one "
                 "sync) = the time per token of each sequence; gpu_ms = median CUDA-event span on the backend's "
                 "stream from the step's first op to the end of the LM head; tok_s = B / step_ms; steps of up to "
                 "256 rows replay the backend's CUDA graphs (the profiled top_ops steps run eagerly)"},
      {"us_per_layer", "gpu_ms / layers (includes the embedding and LM head spread over the layers)"},
      {"floor", "weight bytes a decode step reads: every layer's dense weights (attention, compressors, indexer, "
                "router, shared expert, norms/mHC) + the LM head + expected distinct routed experts per layer "
                "E(1-(1-K/E)^B) x expert bytes (uniform random routing) ; floor_ms = bytes / copy_gbs (a same-run "
                "1 GiB cudaMemcpy D2D, read + write bytes per second); ratio = gpu_ms / floor_ms"},
      {"top_ops", "one eager decode step with a CUDA event after every op call (cuda/op_timer.h): time between "
                  "consecutive events per op label, summed over the layers; a linear is labelled by its weight "
                  "(its bf16 cast included), other ops by kernel family; the events between kernels also stop programmatic "
                  "dependent launch from overlapping them, so the profiled step's span is longer than gpu_ms"}};
  if (!o.mtp.empty())
    out["notes"]["mtp"] =
        "B slots at `context` as for decode; a step of 1 + K random tokens per slot with logits on every row "
        "(sampled as decode samples: on the device with sample_on_device, else copied to the host) and an undo log, then a rollback of every "
        "slot to its first token; step_ms / gpu_ms as for decode (the rollback's copy kernel included in "
        "step_ms). ms_per_token at acceptance a: step_ms / (1 + a + ... + a^K), the tokens a round yields when "
        "each draft is accepted with probability a after its predecessor, without the drafts' cost; draft_ms: "
        "draft() of K greedy tokens per slot (K passes of a synthetic MTP block of the last layer's shape, "
        "sliding-window, score-routed, FP8 e_proj/h_proj; one graph, one download); round_ms_per_token: "
        "(step_ms + draft_ms) / (1 + a + ... + a^K)";
  out["prefill"] = nlohmann::json::array();
  out["decode"] = nlohmann::json::array();
  out["mtp"] = nlohmann::json::array();
  bn.save();

  // Prefill.
  for (int64_t P : o.prefill) {
    if (bn.out_of_time("prefill " + std::to_string(P))) continue;
    try {
      const int64_t chunk = bn.reserve_shrinking(1, std::min(o.prefill_chunk, P), P, std::min<int64_t>(P, 256));
      std::vector<double> wall, gpu;
      const int reps = std::min(o.repeats, 3);
      for (int r = 0; r < 1 + reps; ++r) {
        be.reset_slot(0);
        double g = 0;
        timer.set_mode(OpTimer::Mode::SPAN);
        const auto t = Clock::now();
        for (int64_t done = 0; done < P; done += chunk) {
          bn.prefill_step(0, std::min(chunk, P - done));
          g += timer.span_ms();
        }
        const double w = seconds_since(t) * 1e3;
        timer.set_mode(OpTimer::Mode::OFF);
        if (r > 0) wall.push_back(w), gpu.push_back(g);
      }
      const double w = median(wall), g = median(gpu);
      out["prefill"].push_back({{"tokens", P}, {"chunk", chunk}, {"wall_ms", w}, {"gpu_ms", g},
                                {"tok_s", double(P) / (w * 1e-3)}, {"gpu_tok_s", double(P) / (g * 1e-3)}});
      progress(strf("prefill %lld tokens: %.1f ms, %.0f tok/s", (long long)P, w, double(P) / (w * 1e-3)));
      if (!out.contains("prefill_top_ops")) {  // one step of the first prompt's chunk, from an empty slot
        be.reset_slot(0);
        out["prefill_top_ops"] = top_ops(timer, [&] { bn.prefill_step(0, chunk); });
        out["prefill_top_ops"]["tokens"] = chunk;
      }
    } catch (const std::exception& e) {
      out["errors"].push_back(strf("prefill %lld: %s", (long long)P, e.what()));
      progress(strf("prefill %lld failed: %s", (long long)P, e.what()));
    }
    bn.save();
  }

  // Decode at each context.
  for (int64_t ctx : o.contexts) {
    if (bn.out_of_time("decode at context " + std::to_string(ctx))) continue;
    // Filling slot 0 takes about ctx / (the measured prefill rate); skip a context that cannot finish in the budget.
    if (o.max_seconds > 0 && !out["prefill"].empty()) {
      const double rate = out["prefill"].back()["tok_s"].get<double>();
      const double left = o.max_seconds - seconds_since(bn.t0);
      if (rate > 0 && double(ctx) / rate > left) {
        out["skipped"].push_back(strf("decode at context %lld: filling it would take about %.0f s at %.0f tok/s, "
                                      "%.0f s of the --max-seconds budget are left",
                                      (long long)ctx, double(ctx) / rate, rate, left));
        progress("skipped decode at context " + std::to_string(ctx) + " (time budget)");
        continue;
      }
    }
    try {
      // The largest batch whose state fits at this context (the layer count was chosen for the largest
      // context and batch together only when both fit); the batches above it are reported as skipped.
      std::vector<int64_t> batches = o.batches;
      std::sort(batches.begin(), batches.end());
      int64_t fill = 0;
      while (!batches.empty()) {
        const int64_t b = batches.back();
        try {
          fill = bn.reserve_shrinking(int32_t(b), std::max(o.fill_chunk, b), ctx + decode_margin,
                                      std::max<int64_t>(b, 256));
          break;
        } catch (const Error& e) {
          out["skipped"].push_back(strf("decode batch %lld at context %lld: %s", (long long)b, (long long)ctx, e.what()));
          progress(strf("skipped decode batch %lld at context %lld (does not fit)", (long long)b, (long long)ctx));
          batches.pop_back();
        }
      }
      if (batches.empty()) continue;
      const int64_t top_b = batches.back();
      const auto tf = Clock::now();
      bn.prefill(0, ctx, fill);
      for (int32_t s = 1; s < int32_t(top_b); ++s) be.copy_slot(0, s);
      out["fill_seconds"][std::to_string(ctx)] = seconds_since(tf);
      progress(strf("filled slot 0 to %lld tokens and copied it to %lld slots in %.1f s", (long long)ctx,
                    (long long)top_b - 1, seconds_since(tf)));
      for (int64_t B : batches) {
        if (bn.out_of_time(strf("decode batch %lld context %lld", (long long)B, (long long)ctx))) continue;
        std::vector<double> wall, gpu;
        for (int r = 0; r < o.warmup + o.repeats; ++r) {
          timer.set_mode(OpTimer::Mode::SPAN);
          const auto t = Clock::now();
          bn.decode_step(B);
          const double w = seconds_since(t) * 1e3;
          if (r >= o.warmup) wall.push_back(w), gpu.push_back(timer.span_ms());
        }
        timer.set_mode(OpTimer::Mode::OFF);
        const double w = median(wall), g = median(gpu);
        double bytes = double(sd->head_bytes);
        const double ex = expected_experts(c.n_routed_experts, c.n_experts_per_tok, B);
        for (size_t db : sd->dense_layer_bytes) bytes += double(db) + ex * double(sd->expert_bytes);
        const double floor_ms = bytes / (copy_gbs * 1e9) * 1e3;
        out["decode"].push_back({{"context", ctx}, {"batch", B}, {"step_ms", w}, {"gpu_ms", g},
                                 {"tok_s", double(B) / (w * 1e-3)}, {"us_per_layer", g * 1e3 / double(NL)},
                                 {"expected_experts_per_layer", ex}, {"weight_bytes", bytes}, {"floor_ms", floor_ms},
                                 {"ratio_to_floor", g / floor_ms}});
        progress(strf("decode B=%lld ctx=%lld: step %.3f ms (GPU %.3f ms, %.1f us/layer), floor %.3f ms, %.2fx",
                      (long long)B, (long long)ctx, w, g, g * 1e3 / double(NL), floor_ms, g / floor_ms));
        bn.save();
      }
      // MTP verify steps at this context.
      for (int64_t K : o.mtp)
        for (int64_t B : o.mtp_batches) {
          if (std::find(batches.begin(), batches.end(), B) == batches.end()) continue;
          if (B * (1 + K) > fill || K + 1 > be.undo_token_limit()) {
            out["skipped"].push_back(strf("mtp K=%lld batch %lld: %lld rows exceed the reserved %lld-row steps or "
                                          "the undo limit of %lld tokens", (long long)K, (long long)B,
                                          (long long)(B * (1 + K)), (long long)fill, (long long)be.undo_token_limit()));
            continue;
          }
          if (bn.out_of_time(strf("mtp K=%lld batch %lld context %lld", (long long)K, (long long)B, (long long)ctx)))
            continue;
          std::vector<double> wall, gpu;
          for (int r = 0; r < o.warmup + o.repeats; ++r) {
            timer.set_mode(OpTimer::Mode::SPAN);
            const auto t = Clock::now();
            bn.verify_step(B, K);
            const double w = seconds_since(t) * 1e3;
            if (r >= o.warmup) wall.push_back(w), gpu.push_back(timer.span_ms());
          }
          timer.set_mode(OpTimer::Mode::OFF);
          const double w = median(wall), g = median(gpu);
          nlohmann::json per_token;
          std::string line;
          for (double a : {0.5, 0.7, 0.9}) {
            double yield = 0, p = 1;
            for (int64_t j = 0; j <= K; ++j) yield += p, p *= a;
            per_token[strf("%.1f", a)] = w / yield;
            line += strf(" a=%.1f: %.3f ms/token", a, w / yield);
          }
          // The drafts of such a round: K passes of the MTP block over B rows (one graph, one download).
          std::vector<double> dwall;
          for (int r = 0; r < o.warmup + o.repeats; ++r) {
            const auto t = Clock::now();
            bn.draft(B, K);
            if (r >= o.warmup) dwall.push_back(seconds_since(t) * 1e3);
          }
          const double dw = median(dwall);
          nlohmann::json round_per_token;
          std::string rline;
          for (double a : {0.5, 0.7, 0.9}) {
            double yield = 0, p = 1;
            for (int64_t j = 0; j <= K; ++j) yield += p, p *= a;
            round_per_token[strf("%.1f", a)] = (w + dw) / yield;
            rline += strf(" a=%.1f: %.3f", a, (w + dw) / yield);
          }
          out["mtp"].push_back({{"context", ctx}, {"batch", B}, {"k", K}, {"rows", B * (1 + K)}, {"step_ms", w},
                                {"gpu_ms", g}, {"ms_per_token", per_token}, {"draft_ms", dw},
                                {"round_ms_per_token", round_per_token}});
          progress(strf("mtp verify K=%lld B=%lld ctx=%lld: step %.3f ms (GPU %.3f ms);%s; drafts %.3f ms; verify + "
                        "drafts per token:%s ms",
                        (long long)K, (long long)B, (long long)ctx, w, g, line.c_str(), dw, rline.c_str()));
          bn.save();
        }
      // The top ops of one decode step at the smallest and the largest batch (first context only).
      if (!out.contains("top_ops"))
        for (int64_t B : {batches.front(), top_b}) {
          nlohmann::json t = top_ops(timer, [&] { bn.decode_step(B); });
          t["batch"] = B;
          t["context"] = ctx;
          out["top_ops"].push_back(t);
          if (B == top_b) break;
        }
    } catch (const std::exception& e) {
      out["errors"].push_back(strf("decode at context %lld: %s", (long long)ctx, e.what()));
      progress(strf("decode at context %lld failed: %s", (long long)ctx, e.what()));
    }
    bn.save();
  }
  out["seconds"] = seconds_since(bn.t0);
  bn.save();
  return out;
}

}  // namespace cm::cuda
