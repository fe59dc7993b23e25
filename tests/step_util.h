// Running token sequences through the engine seam in tests: one slot, fixed
// chunk sizes, every row's logits.
#pragma once
#include <algorithm>
#include <cstring>
#include <string>
#include <memory>
#include <vector>

#include "seam/backend.h"
#include "io/safetensors.h"
#include "common/error.h"
#include "model/model.h"
#include "factory/factory.h"

namespace cm::test {

// A golden fixture's expected.safetensors: the token ids (I64) and transformers' logits [T, V].
struct Expected {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};
inline Expected read_expected(const std::string& dir) {
  SafetensorsFile f(dir + "/expected.safetensors");
  const TensorView* t = f.find("tokens");
  const TensorView* l = f.find("logits");
  if (!t || !l) fail("{}/expected.safetensors lacks tokens or logits", dir);
  Expected e;
  for (int64_t i = 0; i < t->numel(); ++i) {
    int64_t v;
    std::memcpy(&v, t->data + 8 * i, 8);
    e.tokens.push_back(int32_t(v));
  }
  e.logits.resize(size_t(l->numel()));
  std::memcpy(e.logits.data(), l->data, size_t(l->numel()) * 4);
  return e;
}

// A backend of device d for m, reserved for `slots` sequences of up to ctx tokens.
inline std::unique_ptr<ModelBackend> reserved_backend(const Model& m, Device d, int32_t slots, int32_t step_tokens,
                                                      int64_t ctx, const BackendOptions& opt = {}) {
  std::unique_ptr<ModelBackend> be = make_backend(m, d, opt);
  be->reserve(CacheShape{slots, step_tokens, ctx});
  return be;
}

// Feeds toks into `slot` (continuing it) `chunk` tokens per step (0 = all at once);
// returns the logits of every row [n, V].
inline std::vector<float> feed_chunks(ModelBackend& be, int32_t slot, const int32_t* toks, int64_t n, int64_t chunk,
                                      int64_t V) {
  if (chunk <= 0) chunk = n;
  std::vector<float> out(size_t(n * V));
  std::vector<int32_t> pos(static_cast<size_t>(n)), sl(static_cast<size_t>(n), slot);
  std::vector<uint8_t> want(static_cast<size_t>(n), 1);
  const int64_t p0 = be.slot_pos(slot);
  for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
  for (int64_t i = 0; i < n; i += chunk) {
    const int32_t len = int32_t(std::min(chunk, n - i));
    be.step(Batch{len, toks + i, pos.data() + i, sl.data(), want.data()}, out.data() + i * V);
  }
  return out;
}

// A fresh CPU run of toks in chunks (the model's own context).
inline std::vector<float> cpu_logits(const Model& m, const std::vector<int32_t>& toks, int64_t chunk,
                                     const BackendOptions& opt = {}) {
  const int64_t n = int64_t(toks.size());
  auto be = reserved_backend(m, Device::CPU, 1, int32_t(chunk > 0 ? std::min(chunk, n) : n), n, opt);
  return feed_chunks(*be, 0, toks.data(), n, chunk, m.config.vocab_size);
}

}  // namespace cm::test
