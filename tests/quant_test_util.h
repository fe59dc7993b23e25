// Helpers shared by the quantization tests: reference decoders written from
// the bit-field definitions (spec §9.1, independent of common/numeric.h),
// independent row dequantization per stored format, and a tiny checkpoint
// builder on top of write_safetensors.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/safetensors.h"

namespace qt {

inline double ref_e2m1(int c) {
  int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
  double v = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * std::pow(2.0, e - 1);
  return s ? -v : v;
}
inline double ref_e4m3(int c) {  // NaN for 0x7F/0xFF
  int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return NAN;
  double v = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -v : v;
}
inline double ref_e8m0(int c) { return c == 255 ? NAN : std::pow(2.0, c - 127); }

// Scratch directories of this process, removed when the test binary exits.
struct TmpDirs {
  std::vector<std::string> dirs;
  ~TmpDirs() {
    std::error_code ec;
    for (const std::string& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
inline TmpDirs g_tmpdirs;

// Per-test scratch directory.
inline std::string tmpdir(const std::string& tag) {
  auto p = std::filesystem::temp_directory_path() /
           ("cm_q_" + tag + "_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  g_tmpdirs.dirs.push_back(p.string());
  return p.string();
}

inline cm::TensorData raw(const std::string& name, cm::DType dt, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  return cm::TensorData{name, dt, std::move(shape), std::move(bytes)};
}
inline cm::TensorData scalar(const std::string& name, float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return cm::TensorData{name, cm::DType::F32, {}, b};
}
inline cm::TensorData f32s(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  return cm::tensor_f32(name, std::move(shape), v.data());
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cm::Error& e) {
    return e.what();
  }
  return "";
}

// True when some line of `lines` contains every needle.
inline bool any_line_has(const std::vector<std::string>& lines, std::initializer_list<std::string> needles) {
  for (const std::string& l : lines) {
    bool all = true;
    for (const std::string& n : needles) all = all && l.find(n) != std::string::npos;
    if (all) return true;
  }
  return false;
}

}  // namespace qt
