#include "cli/version.h"

#include "clawmine_build_info.h"  // generated at build time: CLAWMINE_GIT_COMMIT

namespace cm::cli {

VersionInfo version_info() {
  VersionInfo v{CLAWMINE_VERSION, CLAWMINE_GIT_COMMIT, CLAWMINE_BUILD_TYPE, false, CLAWMINE_CUDA_ARCHS};
#ifdef CLAWMINE_HAVE_CUDA
  v.cuda = true;
#endif
  return v;
}

std::string version_text() {
  const VersionInfo v = version_info();
  std::string s = "clawmine " + v.version + "\n";
  s += "commit: " + v.commit + "\n";
  s += "build type: " + v.build_type + "\n";
  s += v.cuda ? "CUDA backend: on (GPU architectures: " + v.cuda_archs + ")\n" : std::string("CUDA backend: off\n");
  return s;
}

}  // namespace cm::cli
