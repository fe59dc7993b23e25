// A release-spelled test checkpoint with an MTP block (test_mtp_weights.cpp, the seam suite's MTP
// tests): the golden fixture release_real_ratios plus `mtp.0.*` built from its own pieces.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/numeric.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test_util.h"

namespace cm::test::mtp {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A release-spelled fixture: 4 layers (ratios 0, 4, 128, 4; layer 0 sliding-window), 1 MTP entry.
inline const std::string kRelease = std::string(CLAWMINE_TEST_DATA) + "/golden/release_real_ratios";

inline json release_config() { return json::parse(std::ifstream(kRelease + "/config.json")); }

inline int64_t hidden_of(const json& cfg) {
  return cfg.contains("dim") ? cfg["dim"].get<int64_t>() : cfg["hidden_size"].get<int64_t>();
}

inline std::vector<TensorData> release_tensors() { return cm::test::checkpoint_tensors(kRelease); }

inline const TensorData& find(const std::vector<TensorData>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("fixture lacks " + name);
}

inline TensorData copy_as(const TensorData& t, const std::string& name) {
  TensorData c = t;
  c.name = name;
  return c;
}

inline TensorData bf16_matrix(const std::string& name, int64_t rows, int64_t cols, uint32_t seed) {
  TensorData t;
  t.name = name;
  t.dtype = DType::BF16;
  t.shape = {rows, cols};
  t.bytes.resize(size_t(rows * cols) * 2);
  uint32_t s = seed;
  for (int64_t i = 0; i < rows * cols; ++i) {
    s = s * 1664525u + 1013904223u;
    const uint16_t b = f32_to_bf16(float(int32_t(s >> 8) - (1 << 23)) / float(1 << 23) * 0.05f);
    t.bytes[size_t(2 * i)] = uint8_t(b & 0xFF);
    t.bytes[size_t(2 * i + 1)] = uint8_t(b >> 8);
  }
  return t;
}

// The fixture plus an MTP block built from its pieces: layer 0's sliding-window attention and experts,
// layer 3's score-routing bias, BF16 e_proj/h_proj, the final norm and HC head as the MTP's own.
inline std::vector<TensorData> with_mtp_block(const std::vector<TensorData>& ts, int64_t D) {
  std::vector<TensorData> out = ts;
  for (const auto& t : ts) {
    if (t.name.rfind("layers.0.", 0) != 0 || t.name == "layers.0.ffn.gate.tid2eid") continue;
    out.push_back(copy_as(t, "mtp.0." + t.name.substr(9)));
  }
  out.push_back(copy_as(find(ts, "layers.3.ffn.gate.bias"), "mtp.0.ffn.gate.bias"));
  out.push_back(bf16_matrix("mtp.0.e_proj.weight", D, D, 1));
  out.push_back(bf16_matrix("mtp.0.h_proj.weight", D, D, 2));
  for (const char* n : {"enorm", "hnorm", "norm"})
    out.push_back(copy_as(find(ts, "norm.weight"), std::string("mtp.0.") + n + ".weight"));
  for (const char* n : {"fn", "base", "scale"})
    out.push_back(copy_as(find(ts, std::string("hc_head_") + n), std::string("mtp.0.hc_head_") + n));
  return out;
}

inline std::string write_checkpoint(const std::string& tag, const std::vector<TensorData>& ts, const json& cfg) {
  fs::path d = fs::temp_directory_path() / ("cm_mtp_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(d);
  fs::create_directories(d);
  write_safetensors((d / "model.safetensors").string(), ts);
  std::ofstream(d / "config.json") << cfg.dump();
  return d.string();
}

inline LoadOptions with_mtp() {
  LoadOptions o;
  o.mtp = true;
  return o;
}

// The fixture with its MTP block, written once per test process.
inline const std::string& mtp_checkpoint() {
  static const std::string dir = [] {
    const json cfg = release_config();
    return write_checkpoint("block", with_mtp_block(release_tensors(), hidden_of(cfg)), cfg);
  }();
  return dir;
}

inline std::unique_ptr<Model> mtp_model() { return model_load(mtp_checkpoint(), with_mtp()); }


}  // namespace cm::test::mtp
