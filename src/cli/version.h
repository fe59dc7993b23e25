// What `clawmine --version` prints (and `GET /version` of the server answers): version, git
// commit, build type, whether the CUDA backend is compiled in and for which GPU architectures.
#pragma once
#include <string>

namespace cm::cli {
struct VersionInfo {
  std::string version, commit, build_type;
  bool cuda = false;
  std::string cuda_archs;  // "sm_90a", or "none"
};
VersionInfo version_info();
std::string version_text();
}  // namespace cm::cli
