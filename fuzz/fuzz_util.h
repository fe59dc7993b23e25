// Helpers shared by the fuzz targets. A target lets only cm::Error escape the engine call
// (what bad input must raise); any other exception reaches libFuzzer as a crash, and so does a
// broken invariant checked with fuzz_check (it prints what broke, then aborts).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace cm::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

inline void fuzz_check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

}  // namespace cm::fuzz
