#include "cli/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace {

// Runnable tasks in the whole system right now (4th field of /proc/loadavg,
// "running/total"), this process included; -1 when unknown.
int runnable_now() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return -1;
  double a, b, c;
  int running = -1, total = 0;
  if (std::fscanf(f, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total) != 5) running = -1;
  std::fclose(f);
  return running;
}

}  // namespace

namespace cm::cli {

void ensure_passive_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv("/proc/self/exe", argv);
  // Only reached when the exec failed: run on with libgomp's default policy.
}

int available_cores() {
  cpu_set_t set;
  int cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = int(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return cores;
}

int default_threads() {
  const int cores = available_cores();
  // The count is a snapshot; take the least of a few reads so that a short
  // burst (another process starting) does not halve the threads.
  int others = 1 << 30;
  for (int i = 0; i < 3; ++i) {
    int r = runnable_now();
    if (r < 1) {
      others = 0;
      break;
    }
    others = std::min(others, r - 1);  // minus this process
    if (i < 2) ::usleep(1000);
  }
  return std::clamp(cores - others, 1, cores);
}

}  // namespace cm::cli
