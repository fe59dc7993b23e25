// Fuzz target: a safetensors file (header length, header JSON, data) and a
// model.safetensors.index.json, both parsed from memory by the functions SafetensorsFile and
// TensorStore::open_dir use. Every input goes through both parsers (the corpus holds both
// kinds). Checks: every accepted tensor view lies inside the input and its byte size matches
// its dtype and shape.
#include <cstring>

#include "common/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

using cm::fuzz::fuzz_check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    cm::SafetensorsContents c = cm::parse_safetensors(data, size, "fuzz.safetensors");
    for (const auto& [name, v] : c.tensors) {
      fuzz_check(v.name == name, "view name differs from its key");
      fuzz_check(v.data >= data && v.data + v.nbytes <= data + size, "tensor view outside the file");
      fuzz_check(uint64_t(v.numel()) * cm::dtype_size(v.dtype) == v.nbytes, "byte size != numel x dtype size");
      (void)v.shape_str();
      if (v.nbytes) {
        uint8_t first, last;
        std::memcpy(&first, v.data, 1);  // ASan would flag a view into freed or foreign memory
        std::memcpy(&last, v.data + v.nbytes - 1, 1);
        (void)first, (void)last;
      }
    }
  } catch (const cm::Error&) {
  }
  try {
    auto by_file = cm::parse_safetensors_index(cm::fuzz::as_text(data, size), "fuzz.index.json");
    for (const auto& [file, names] : by_file) {
      fuzz_check(file.find('/') == std::string::npos && file != "..", "index shard outside the directory");
      fuzz_check(!names.empty(), "index shard with no tensors");
    }
  } catch (const cm::Error&) {
  }
  return 0;
}
