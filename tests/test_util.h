// Helpers shared by the CPU test suites.
#pragma once
#include <functional>
#include <string>

#include "common/error.h"

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

}  // namespace cm::test
