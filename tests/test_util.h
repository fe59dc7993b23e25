// Helpers shared by the CPU test suites.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/safetensors.h"

namespace cm::test {

// The message of the cm::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every tensor of the checkpoint in dir, copied (a golden fixture's "tokens" and "logits" left out),
// for tests that edit a checkpoint and write it back (write_safetensors).
inline std::vector<TensorData> checkpoint_tensors(const std::string& dir) {
  TensorStore s = TensorStore::open_dir(dir);
  std::vector<TensorData> ts;
  for (auto& [name, v] : s.all()) {
    if (name == "tokens" || name == "logits") continue;
    TensorData t;
    t.name = name;
    t.dtype = v->dtype;
    t.shape = v->shape;
    t.bytes.assign(v->data, v->data + v->nbytes);
    ts.push_back(std::move(t));
  }
  return ts;
}

}  // namespace cm::test
