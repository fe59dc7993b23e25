// What `clawmine --version` prints: version, git commit, build type, whether
// the CUDA backend is compiled in and for which GPU architectures.
#pragma once
#include <string>

namespace cm::cli {
std::string version_text();
}
