// Error reporting for CUDA translation units. nvcc cannot compile fmt's
// C++20 format-string machinery, so .cu files format with printf-style
// strf() and throw through throw_error(), which raises cm::Error from a
// host-compiled file. Same contract as CM_CHECK: one clear line, never abort.
#pragma once
#include <string>

namespace cm::cuda {

[[noreturn]] void throw_error(const std::string& msg);
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace cm::cuda

// CM_CU_CHECK(cond, "printf format", args...): throw cm::Error when cond is false.
#define CM_CU_CHECK(cond, ...)                                            \
  do {                                                                    \
    if (!(cond)) ::cm::cuda::throw_error(::cm::cuda::strf(__VA_ARGS__)); \
  } while (0)
