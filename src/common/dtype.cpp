#include "common/dtype.h"

namespace cm {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},         {DType::F16, "F16", 2},          {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E8M0, "F8_E8M0", 1}, {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},           {DType::I32, "I32", 4},          {DType::I64, "I64", 8},
};
}  // namespace

size_t dtype_size(DType t) { return kDTypes[static_cast<int>(t)].size; }
std::string_view dtype_name(DType t) { return kDTypes[static_cast<int>(t)].name; }

bool dtype_parse(std::string_view name, DType* out) {
  for (const auto& d : kDTypes) {
    if (d.name == name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

}  // namespace cm
