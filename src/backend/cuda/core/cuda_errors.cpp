// Host side of cuda_errors.h: formatting and the cm::Error throw.
#include "backend/cuda/core/cuda_errors.h"

#include <cstdarg>
#include <cstdio>

#include "common/error.h"

namespace cm::cuda {

void throw_error(const std::string& msg) { throw Error(msg); }

std::string strf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

}  // namespace cm::cuda
