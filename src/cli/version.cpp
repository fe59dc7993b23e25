#include "cli/version.h"

#include "clawmine_build_info.h"  // generated at build time: CLAWMINE_GIT_COMMIT

namespace cm::cli {

std::string version_text() {
  std::string s = "clawmine " CLAWMINE_VERSION "\n";
  s += "commit: " CLAWMINE_GIT_COMMIT "\n";
  s += "build type: " CLAWMINE_BUILD_TYPE "\n";
#ifdef CLAWMINE_HAVE_CUDA
  s += "CUDA backend: on (GPU architectures: " CLAWMINE_CUDA_ARCHS ")\n";
#else
  s += "CUDA backend: off\n";
#endif
  return s;
}

}  // namespace cm::cli
