// Uploading the model's weights to the GPU in their stored format (see device_model.h).
#include "backend/cuda/device_model.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <utility>

#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/step/step_kernels.h"

namespace cm::cuda {

namespace {

DevF32 upload_f32(const std::vector<float>& v) {
  DevF32 d;
  if (v.empty()) return d;
  d.buf.alloc(v.size() * 4);
  d.buf.upload(v.data(), v.size() * 4);
  return d;
}

size_t f32_bytes(const std::vector<float>& v) { return v.size() * 4; }
size_t hc_bytes(const HcWeights& h) { return f32_bytes(h.fn) + f32_bytes(h.base) + f32_bytes(h.scale); }

// Routed experts go to the packed MoE kernels when they are FP4 and the kernels take their shape.
// The routed experts a layer holds, [first, end): all of them, or one rank's share (LoadOptions::experts;
// the others' weights are empty). {0, 0}: none.
std::pair<int64_t, int64_t> held_experts(const LayerWeights& lw) {
  auto held = [](const ExpertWeights& e) { return !(e.w1.empty() && e.w2.empty() && e.w3.empty()); };
  int64_t first = 0, end = int64_t(lw.experts.size());
  while (first < end && !held(lw.experts[size_t(first)])) ++first;
  while (end > first && !held(lw.experts[size_t(end - 1)])) --end;
  return {first, end};
}

bool packed_experts_ok(const Config& c, const LayerWeights& lw) {
  const auto [first, end] = held_experts(lw);
  if (first == end) return false;
  for (int64_t i = first; i < end; ++i)
    for (const LinearWeight* w : {&lw.experts[size_t(i)].w1, &lw.experts[size_t(i)].w2, &lw.experts[size_t(i)].w3})
      if (w->format != WeightFormat::NVFP4 && w->format != WeightFormat::MXFP4) return false;
  return c.hidden_size % 64 == 0 && c.moe_inter % 64 == 0 && lw.experts.size() <= 1024;
}

DevF32 view_f32(const std::vector<float>& v, size_t& group) {
  group += f32_bytes(v);
  return upload_f32(v);
}

// The MoE kernel clamps with its limit unconditionally; a config without one (0) clamps nowhere.
float no_limit_is_inf(float limit) { return limit > 0 ? limit : std::numeric_limits<float>::infinity(); }

std::string mib(size_t b) { return strf("%.2f MiB", double(b) / double(size_t(1) << 20)); }

}  // namespace

size_t fast_prefill_panel_bytes(const DevModel& m) {
  size_t b = 0;
  const auto take = [&](const DevLinear& w) {
    if (w.wants_bf16_input()) b = std::max(b, prefill_panel_bytes(w.N, w.K, w.groups));
  };
  take(m.head);
  for (const DevLayer& l : m.layers) {
    for (const DevLinear* w : {&l.wq_a, &l.wq_b, &l.wkv, &l.wo_a, &l.wo_b, &l.index_wq_b, &l.index_weights_proj, &l.gate})
      take(*w);
    for (const DevCompressor* c : {l.comp.get(), l.index_comp.get()})
      if (c) take(c->wkv), take(c->wgate);
    for (const DevExpert& e : l.dense_experts) take(e.w1), take(e.w2), take(e.w3);
    if (l.has_shared) take(l.shared.w1), take(l.shared.w2), take(l.shared.w3);
  }
  return b;
}

size_t model_device_bytes(const Model& m) {
  const Weights& w = m.weights;
  size_t b = w.embed.stored_bytes() + w.head.stored_bytes() + f32_bytes(w.norm) + f32_bytes(w.hc_head_fn);
  std::vector<const LayerWeights*> layers;
  for (const LayerWeights& lw : w.layers) layers.push_back(&lw);
  for (const MtpWeights& mw : w.mtp) {
    layers.push_back(&mw.block);
    b += mw.e_proj.stored_bytes() + mw.h_proj.stored_bytes() + f32_bytes(mw.enorm) + f32_bytes(mw.hnorm) +
         f32_bytes(mw.norm) + f32_bytes(mw.hc_head_fn);
  }
  for (const LayerWeights* lp : layers) {
    const LayerWeights& lw = *lp;
    b += hc_bytes(lw.hc_attn) + hc_bytes(lw.hc_ffn) + f32_bytes(lw.attn_norm) + f32_bytes(lw.ffn_norm);
    b += lw.wq_a.stored_bytes() + lw.wq_b.stored_bytes() + lw.wkv.stored_bytes() + lw.wo_a.stored_bytes() +
         lw.wo_b.stored_bytes();
    for (const CompressorWeights* c : {lw.compressor.get(), lw.indexer ? &lw.indexer->comp : nullptr})
      if (c) b += c->wkv.stored_bytes() + c->wgate.stored_bytes() + f32_bytes(c->ape);
    if (lw.indexer) b += lw.indexer->wq_b.stored_bytes() + lw.indexer->weights_proj.stored_bytes();
    b += lw.gate.stored_bytes() + lw.tid2eid.size() * 4;
    for (const ExpertWeights& e : lw.experts) b += e.w1.stored_bytes() + e.w2.stored_bytes() + e.w3.stored_bytes();
    if (lw.has_shared) b += lw.shared.w1.stored_bytes() + lw.shared.w2.stored_bytes() + lw.shared.w3.stored_bytes();
  }
  return b;
}

size_t MemoryBudget::available() const {
  const double cap = utilization * double(total);
  return std::min(free + held, cap >= double(SIZE_MAX) ? SIZE_MAX : size_t(cap));
}

MemoryBudget memory_budget(double utilization, size_t held) {
  CM_CU_CHECK(utilization > 0 && utilization <= 1, "cuda: gpu_memory_utilization must be in (0, 1] (got %g)",
              utilization);
  MemoryBudget b;
  CM_CUDA(cudaMemGetInfo(&b.free, &b.total));
  b.held = held;
  b.utilization = utilization;
  return b;
}

void check_memory(const MemoryBudget& b, size_t need, const std::string& parts) {
  if (need <= b.available()) return;
  throw_error(strf("cuda: the model needs %s of device memory (%s), %s available (utilization %g of %s total, %s free)",
                   gib(need).c_str(), parts.c_str(), gib(b.available()).c_str(), b.utilization, gib(b.total).c_str(),
                   gib(b.free + b.held).c_str()));
}

std::string gib(size_t b) { return strf("%.3f GiB", double(b) / double(size_t(1) << 30)); }

size_t DevBytes::total() const { return embed + attn + comp + experts + shared + router + small; }

void upload_globals(const Model& m, DevModel& dm) {
  const Weights& w = m.weights;
  DevModel* d = &dm;
  DevBytes& g = d->bytes;
  // Embedding: the stored rows as they are (the gather expands them).
  const LinearWeight& e = w.embed;
  CM_CU_CHECK(e.format == WeightFormat::F32 || e.format == WeightFormat::BF16 || e.format == WeightFormat::NVFP4,
              "cuda: embedding '%s' is %s; the GPU embedding takes F32, BF16 or NVFP4", e.name.c_str(),
              weight_format_name(e.format));
  const size_t ebytes = e.format == WeightFormat::F32    ? size_t(e.out_features * e.in_features) * 4
                        : e.format == WeightFormat::BF16 ? size_t(e.out_features * e.in_features) * 2
                                                         : size_t(e.out_features * e.in_features / 2);
  d->embed_data.alloc(ebytes);
  d->embed_data.upload(e.data, ebytes);
  if (e.format == WeightFormat::NVFP4) {
    const size_t sb = size_t(e.out_features * e.in_features / 16);
    d->embed_scale.alloc(sb);
    d->embed_scale.upload(e.scale, sb);
  }
  d->embed = DeviceWeightView{e.format, d->embed_data.get(), d->embed_scale.get(), e.scale_2, e.out_features,
                              e.in_features};
  g.embed += d->embed_data.size() + d->embed_scale.size();
  d->head = upload_linear(w.head);
  g.embed += d->head.bytes();
  d->norm = view_f32(w.norm, g.small);
  d->hc_head_fn = view_f32(w.hc_head_fn, g.small);
  d->hc_head_base = view_f32(w.hc_head_base, g.small);
  d->hc_head_scale = view_f32(w.hc_head_scale, g.small);
  d->rope_main_freqs = view_f32(m.rope_main.freqs, g.small);
  d->rope_compress_freqs = view_f32(m.rope_compress.freqs, g.small);
  d->rope_main = RopeView{d->rope_main_freqs.p(), m.rope_main.rope_dim, m.rope_main.attention_factor};
  d->rope_compress = RopeView{d->rope_compress_freqs.p(), m.rope_compress.rope_dim, m.rope_compress.attention_factor};
}

void upload_layer(const Config& c, const LayerWeights& lw, DevModel& d, int64_t L, const ExpertRange& experts) {
  if (d.layers.size() < size_t(c.num_layers)) d.layers.resize(size_t(c.num_layers));
  upload_layer_into(c, lw, d.layers[size_t(L)], d.bytes, experts);
}

void upload_layer_into(const Config& c, const LayerWeights& lw, DevLayer& dl, DevBytes& g,
                       const ExpertRange& experts) {
  dl.hc_attn_fn = view_f32(lw.hc_attn.fn, g.small);
  dl.hc_attn_base = view_f32(lw.hc_attn.base, g.small);
  dl.hc_attn_scale = view_f32(lw.hc_attn.scale, g.small);
  dl.hc_ffn_fn = view_f32(lw.hc_ffn.fn, g.small);
  dl.hc_ffn_base = view_f32(lw.hc_ffn.base, g.small);
  dl.hc_ffn_scale = view_f32(lw.hc_ffn.scale, g.small);
  dl.attn_norm = view_f32(lw.attn_norm, g.small);
  dl.ffn_norm = view_f32(lw.ffn_norm, g.small);
  dl.q_norm = view_f32(lw.q_norm, g.small);
  dl.kv_norm = view_f32(lw.kv_norm, g.small);
  dl.sinks = view_f32(lw.sinks, g.small);
  dl.wq_a = upload_linear(lw.wq_a);
  dl.wq_b = upload_linear(lw.wq_b);
  dl.wkv = upload_linear(lw.wkv);
  dl.wo_a = upload_linear(lw.wo_a, int(c.o_groups));
  dl.wo_b = upload_linear(lw.wo_b);
  g.attn += dl.wq_a.bytes() + dl.wq_b.bytes() + dl.wkv.bytes() + dl.wo_a.bytes() + dl.wo_b.bytes();
  auto comp = [&](const CompressorWeights& cw) {
    auto dc = std::make_unique<DevCompressor>();
    dc->wkv = upload_linear(cw.wkv);
    dc->wgate = upload_linear(cw.wgate);
    dc->ape = view_f32(cw.ape, g.comp);
    dc->norm = view_f32(cw.norm, g.comp);
    g.comp += dc->wkv.bytes() + dc->wgate.bytes();
    return dc;
  };
  if (lw.compressor) dl.comp = comp(*lw.compressor);
  if (lw.indexer) {
    dl.index_comp = comp(lw.indexer->comp);
    dl.index_wq_b = upload_linear(lw.indexer->wq_b);
    dl.index_weights_proj = upload_linear(lw.indexer->weights_proj);
    g.comp += dl.index_wq_b.bytes() + dl.index_weights_proj.bytes();
  }
  dl.gate = upload_linear(lw.gate);
  dl.gate_bias = view_f32(lw.gate_bias, g.router);
  g.router += dl.gate.bytes();
  if (!lw.tid2eid.empty()) {
    dl.tid2eid.alloc(lw.tid2eid.size() * 4);
    dl.tid2eid.upload(lw.tid2eid.data(), lw.tid2eid.size() * 4);
    g.router += dl.tid2eid.size();
  }
  // No routed expert held at all: the caller supplies them (the synthetic bench makes them on the device).
  auto [e0, e1] = held_experts(lw);
  if (experts.count >= 0 && e0 != e1) {  // one rank's share of what the model holds
    CM_CU_CHECK(experts.first >= e0 && experts.first + experts.count <= e1,
                "cuda: routed experts [%lld, %lld) asked for, but the model holds [%lld, %lld)",
                (long long)experts.first, (long long)(experts.first + experts.count), (long long)e0, (long long)e1);
    e0 = experts.first, e1 = experts.first + experts.count;
  }
  if (e0 == e1) {
  } else if (packed_experts_ok(c, lw)) {
    std::vector<const LinearWeight*> g1, g3, g2;
    for (int64_t i = e0; i < e1; ++i) {
      const ExpertWeights& ew = lw.experts[size_t(i)];
      g1.push_back(&ew.w1), g3.push_back(&ew.w3), g2.push_back(&ew.w2);
    }
    dl.experts =
        std::make_unique<DeviceExperts>(upload_experts(g1, g3, g2, int(e0), no_limit_is_inf(c.swiglu_limit)));
    g.experts += dl.experts->expert_bytes() * size_t(dl.experts->count) + dl.experts->scale2.size();
  } else {
    dl.dense_first = e0;
    for (int64_t i = e0; i < e1; ++i) {
      const ExpertWeights& ew = lw.experts[size_t(i)];
      DevExpert de{upload_linear(ew.w1), upload_linear(ew.w2), upload_linear(ew.w3)};
      g.experts += de.w1.bytes() + de.w2.bytes() + de.w3.bytes();
      dl.dense_experts.push_back(std::move(de));
    }
  }
  dl.has_shared = lw.has_shared;
  if (lw.has_shared) {
    dl.shared = DevExpert{upload_linear(lw.shared.w1), upload_linear(lw.shared.w2), upload_linear(lw.shared.w3)};
    g.shared += dl.shared.w1.bytes() + dl.shared.w2.bytes() + dl.shared.w3.bytes();
  }
}

void finish_report(DevModel& d) {
  const DevBytes& g = d.bytes;
  d.total_bytes = g.total();
  d.report = strf(
      "cuda weights: embedding+head %s, attention %s, compressors+indexers %s, routed experts %s (%s), "
      "shared experts %s, routers %s, norms/mHC/sinks/RoPE %s; total %s",
      mib(g.embed).c_str(), mib(g.attn).c_str(), mib(g.comp).c_str(), mib(g.experts).c_str(),
      d.layers.empty() || !d.layers[0].experts ? "per-expert linears" : "packed FP4 MoE", mib(g.shared).c_str(),
      mib(g.router).c_str(), mib(g.small).c_str(), mib(d.total_bytes).c_str());
  if (d.mtp) d.report += strf(" (the MTP block %s of it)", mib(g.mtp).c_str());
}

std::unique_ptr<DevModel> upload_model(const Model& m, size_t workspace_bytes, double utilization,
                                       const ExpertRange& experts) {
  const Config& c = m.config;
  const size_t weights = model_device_bytes(m);
  check_memory(memory_budget(utilization), weights + workspace_bytes,
               strf("weights %s, working buffers %s", gib(weights).c_str(), gib(workspace_bytes).c_str()));
  auto d = std::make_unique<DevModel>();
  upload_globals(m, *d);
  d->layers.resize(size_t(c.num_layers));
  for (int64_t L = 0; L < c.num_layers; ++L) upload_layer(c, m.weights.layers[size_t(L)], *d, L, experts);
  if (!m.weights.mtp.empty()) d->mtp = upload_mtp(c, m.weights.mtp[0], d->bytes);  // the one the backends run
  finish_report(*d);
  return d;
}

std::unique_ptr<DevMtp> upload_mtp(const Config& c, const MtpWeights& mw, DevBytes& g) {
  {
    auto t = std::make_unique<DevMtp>();
    const size_t before = g.total();
    upload_layer_into(c, mw.block, t->block, g);
    t->e_proj = upload_linear(mw.e_proj);
    t->h_proj = upload_linear(mw.h_proj);
    g.small += t->e_proj.bytes() + t->h_proj.bytes();
    t->enorm = view_f32(mw.enorm, g.small);
    t->hnorm = view_f32(mw.hnorm, g.small);
    t->norm = view_f32(mw.norm, g.small);
    t->hc_head_fn = view_f32(mw.hc_head_fn, g.small);
    t->hc_head_base = view_f32(mw.hc_head_base, g.small);
    t->hc_head_scale = view_f32(mw.hc_head_scale, g.small);
    g.mtp = g.total() - before;  // (counted in its groups too; the report names the block's share)
    return t;
  }
}

}  // namespace cm::cuda
