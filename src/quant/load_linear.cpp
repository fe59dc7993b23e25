#include "quant/load_linear.h"

#include "common/error.h"

namespace cm {

bool has_linear(const TensorStore& store, const std::string& prefix) { return store.find(prefix + ".weight") != nullptr; }

LinearWeight load_linear(const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                         const LinearLoadOptions& opt) {
  const std::string wname = prefix + ".weight";
  const TensorView* t = store.find(wname);
  if (!t) fail("missing tensor '{}' (expected shape [{}, {}])", wname, n, k);
  LinearWeight w;
  w.name = prefix;
  w.out_features = n;
  w.in_features = k;
  w.data = t->data;
  switch (t->dtype) {
    case DType::F32: w.format = WeightFormat::F32; break;
    case DType::BF16: w.format = WeightFormat::BF16; break;
    case DType::F16: w.format = WeightFormat::F16; break;
    default:
      fail("tensor '{}' ({}): quantized linear weights are not supported yet", wname, dtype_name(t->dtype));
  }
  if (t->shape != std::vector<int64_t>{n, k})
    fail("tensor '{}' has shape {}, expected [{}, {}]", wname, t->shape_str(), n, k);
  return w;
}

}  // namespace cm
