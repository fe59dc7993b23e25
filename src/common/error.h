// Engine errors. Everything that can go wrong because of input (a checkpoint, a
// config, a request, a flag) throws cm::Error with one clear line naming the
// problem; the CLI catches it at the top, prints it and exits 1. Kernel code
// returns status codes and the host wraps them. abort() is never used for input.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace cm {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace cm

// CM_CHECK(cond, "format {}", args...): throw cm::Error with the message when cond is false.
#define CM_CHECK(cond, ...)              \
  do {                                   \
    if (!(cond)) ::cm::fail(__VA_ARGS__); \
  } while (0)
