// The synthetic model of `clawmine bench model` (model/synthetic.h): its
// config is V4-Flash's and passes every check of a real config; its weights
// are valid (no NaN code, finite nonzero block scales, every expanded value
// finite, rms near 1/sqrt(K)), deterministic in the seed; a small one steps
// on the CPU backend with finite, non-constant logits. And `bench model`
// without a GPU (or without CUDA) exits 1 saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cli_run.h"
#include "common/numeric.h"
#include "seam/backend.h"
#include "model/synthetic.h"
#include "step_util.h"
#include "factory/factory.h"

using namespace cm;

namespace {

// Every stored block scale finite and nonzero; every expanded value finite; returns rms·sqrt(K).
double check_linear(const LinearWeight& w) {
  EXPECT_FALSE(w.empty()) << w.name;
  const size_t ns = size_t(w.scale_rows * w.scale_cols);
  if (w.format == WeightFormat::NVFP4) {
    EXPECT_EQ(w.scale_dtype, DType::F8_E4M3) << w.name;
    EXPECT_TRUE(std::isfinite(w.scale_2) && w.scale_2 > 0) << w.name;
    for (size_t i = 0; i < ns; ++i) {
      const float s = e4m3_to_f32(w.scale[i]);
      if (!std::isfinite(s) || s == 0.0f) {
        ADD_FAILURE() << w.name << ": block scale " << i << " is " << s;
        break;
      }
    }
  } else if (w.format == WeightFormat::FP8_BLOCK) {
    EXPECT_EQ(w.scale_dtype, DType::F8_E8M0) << w.name;
    for (size_t i = 0; i < ns; ++i)
      if (w.scale[i] == 0xff) {
        ADD_FAILURE() << w.name << ": NaN E8M0 scale at " << i;
        break;
      }
  } else {
    EXPECT_EQ(w.format, WeightFormat::BF16) << w.name;
  }
  std::vector<float> row(size_t(w.in_features));
  double ss = 0;
  for (int64_t n = 0; n < w.out_features; ++n) {
    linear_expand_row(w, n, row.data());
    for (float v : row) {
      if (!std::isfinite(v)) {
        ADD_FAILURE() << w.name << ": non-finite value in row " << n;
        return 0;
      }
      ss += double(v) * v;
    }
  }
  return std::sqrt(ss / double(w.out_features * w.in_features)) * std::sqrt(double(w.in_features));
}

}  // namespace

TEST(Synthetic, FlashConfigIsTheReleasedOne) {
  const Config c = synthetic_config(SyntheticShape{});
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_experts_per_tok, 6);
  EXPECT_EQ(c.moe_inter, 2048);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.factor, 16.0);
  int csa = 0, hca = 0, swa = 0, hash = 0;
  for (int64_t L = 0; L < c.num_layers; ++L) {
    const AttnKind k = c.attn_kinds[size_t(L)];
    csa += k == AttnKind::CSA, hca += k == AttnKind::HCA, swa += k == AttnKind::SLIDING;
    if (k == AttnKind::HCA) EXPECT_EQ(c.ratio(L), 128);
    hash += c.moe_kinds[size_t(L)] == MoeKind::HASH;
  }
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(swa, 2);
  EXPECT_EQ(hash, 3);
  EXPECT_EQ(c.attn_kinds[0], AttnKind::SLIDING);
  EXPECT_EQ(c.attn_kinds[2], AttnKind::CSA);
  EXPECT_EQ(c.attn_kinds[3], AttnKind::HCA);
  // Fewer layers take the pattern's prefix; more than Flash has is an error naming the count.
  EXPECT_EQ(flash_compress_ratios(5), (std::vector<int64_t>{0, 0, 4, 128, 4}));
  EXPECT_THROW(flash_compress_ratios(44), Error);
}

TEST(Synthetic, TinyWeightsAreValidAndDeterministic) {
  const SyntheticShape s = synthetic_tiny_shape();
  auto m = synthetic_model(s, 7);
  const Config& c = m->config;
  ASSERT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.attn_kinds[0], AttnKind::CSA);
  EXPECT_EQ(c.attn_kinds[1], AttnKind::HCA);
  std::vector<const LinearWeight*> all{&m->weights.embed, &m->weights.head};
  for (const LayerWeights& lw : m->weights.layers) {
    for (const LinearWeight* w : {&lw.wq_a, &lw.wq_b, &lw.wkv, &lw.wo_a, &lw.wo_b, &lw.gate, &lw.shared.w1,
                                  &lw.shared.w2, &lw.shared.w3})
      all.push_back(w);
    for (const CompressorWeights* cw : {lw.compressor.get(), lw.indexer ? &lw.indexer->comp : nullptr})
      if (cw) all.push_back(&cw->wkv), all.push_back(&cw->wgate);
    if (lw.indexer) all.push_back(&lw.indexer->wq_b), all.push_back(&lw.indexer->weights_proj);
    ASSERT_EQ(lw.experts.size(), size_t(c.n_routed_experts));
    for (const ExpertWeights& e : lw.experts) {
      for (const LinearWeight* w : {&e.w1, &e.w2, &e.w3}) {
        EXPECT_EQ(w->format, WeightFormat::NVFP4) << w->name;
        all.push_back(w);
      }
    }
    EXPECT_EQ(lw.wq_a.format, WeightFormat::FP8_BLOCK);
    EXPECT_EQ(lw.gate.format, WeightFormat::BF16);
  }
  // Layer 0 is hash-routed: K distinct experts per token, all in range.
  const std::vector<int32_t>& t2e = m->weights.layers[0].tid2eid;
  ASSERT_EQ(t2e.size(), size_t(c.vocab_size * c.n_experts_per_tok));
  for (int64_t t = 0; t < c.vocab_size; ++t) {
    EXPECT_GE(t2e[size_t(2 * t)], 0);
    EXPECT_LT(t2e[size_t(2 * t)], c.n_routed_experts);
    EXPECT_NE(t2e[size_t(2 * t)], t2e[size_t(2 * t + 1)]);
  }
  for (const LinearWeight* w : all) {
    const double r = check_linear(*w);
    EXPECT_GT(r, 0.3) << w->name;
    EXPECT_LT(r, 3.0) << w->name;
  }
  // Same seed, same bits; another seed, other bits.
  auto m2 = synthetic_model(s, 7), m3 = synthetic_model(s, 8);
  const LinearWeight &a = m->weights.layers[1].experts[3].w2, &b = m2->weights.layers[1].experts[3].w2,
                     &d = m3->weights.layers[1].experts[3].w2;
  EXPECT_EQ(a.owned, b.owned);
  EXPECT_EQ(a.owned_scale, b.owned_scale);
  EXPECT_NE(a.owned, d.owned);
}

TEST(Synthetic, TinyStepsOnTheCpuBackend) {
  auto m = synthetic_model(synthetic_tiny_shape(), 3);
  const int64_t V = m->config.vocab_size, T = 20;
  std::vector<int32_t> toks(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) toks[size_t(i)] = int32_t((i * 37 + 5) % V);
  const std::vector<float> logits = test::cpu_logits(*m, toks, 8);
  ASSERT_EQ(logits.size(), size_t(T * V));
  double mean = 0, var = 0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    mean += x;
  }
  mean /= double(logits.size());
  for (float x : logits) var += (x - mean) * (x - mean);
  EXPECT_GT(var / double(logits.size()), 1e-6);  // the weights do something
}

// All 43 of Flash's layers (its ratio pattern, small dimensions): the weights' scales keep
// the residual stream finite and the logits of a sane size through the whole depth.
TEST(Synthetic, FlashDepthStaysFinite) {
  SyntheticShape s = synthetic_tiny_shape();
  s.layers = 43;
  s.ratios.clear();
  s.hash_layers = 3;
  auto m = synthetic_model(s, 4);
  const int64_t V = m->config.vocab_size, T = 6;
  std::vector<int32_t> toks{5, 100, 7, 300, 2, 9};
  const std::vector<float> logits = test::cpu_logits(*m, toks, 0);
  double amax = 0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    amax = std::max(amax, double(std::fabs(x)));
  }
  std::printf("  43-layer synthetic: max |logit| %.3g over %lld x %lld\n", amax, (long long)T, (long long)V);
  EXPECT_GT(amax, 1e-3);
  EXPECT_LT(amax, 1e4);
}

TEST(Synthetic, BenchModelWithoutGpuExitsOne) {
  if (device_available(Device::CUDA)) GTEST_SKIP() << "a CUDA GPU is present: bench model would run";
  const test::RunResult r = test::run_program({CLAWMINE_BINARY, "bench", "model", "--layers", "1"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("bench model:"), std::string::npos) << r.err;
  const bool says = r.err.find("without the CUDA backend") != std::string::npos ||
                    r.err.find("no CUDA GPU") != std::string::npos;
  EXPECT_TRUE(says) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}
