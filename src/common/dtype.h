// Storage dtypes of safetensors tensors and their element sizes. Names follow
// the safetensors spelling ("F8_E4M3", "BF16", ...).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cm {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, F8_E8M0, U8, I8, I32, I64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; returns false for names we do not support.
bool dtype_parse(std::string_view name, DType* out);

}  // namespace cm
