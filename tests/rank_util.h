// Running R simulated ranks (threads over make_thread_comms) in tests: fn(rank's Comm)
// runs on its own thread; the first exception of any rank is rethrown after all joined.
#pragma once
#include <omp.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "model/model.h"

namespace cm::test {

inline void run_ranks(int R, const std::function<void(Comm&)>& fn, double timeout_s = 120) {
  std::vector<std::unique_ptr<Comm>> comms = make_thread_comms(R, timeout_s);
  std::vector<std::exception_ptr> err(static_cast<size_t>(R));
  std::vector<std::thread> th;
  for (int r = 0; r < R; ++r)
    th.emplace_back([&, r] {
      omp_set_num_threads(1);  // R ranks share this machine's cores
      try {
        fn(*comms[size_t(r)]);
      } catch (...) {
        err[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

// Rank r of R's model: only its routed experts [r·E/R, (r+1)·E/R) loaded.
inline std::unique_ptr<Model> load_rank(const std::string& dir, int r, int R) {
  const int64_t E = config_load(dir).n_routed_experts;
  LoadOptions lo;
  lo.experts = ExpertRange{expert_first(E, r, R), expert_first(E, r + 1, R) - expert_first(E, r, R)};
  return model_load(dir, lo);
}

}  // namespace cm::test
