// ThreadComm: R ranks as threads of one process, for CPU tests of the
// multi-rank code paths (comm.h). Each collective is: publish this rank's
// buffers in the shared group, barrier, every rank reads its peers' buffers
// and writes only its own output, barrier (so no rank reuses a buffer a peer
// may still read). Sums run in rank order, so results are deterministic.
// A rank that never arrives (it threw, or it runs a different collective
// count) makes the others fail after a timeout naming the missing ranks,
// never hang.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "common/error.h"
#include "comm/comm.h"

namespace cm {

namespace {

struct Posted {
  const void* send = nullptr;
  const int64_t* counts = nullptr;  // send counts (all_to_allv) or per-rank counts (all_gatherv)
  int64_t n = 0;
};

struct Group {
  Group(int r, double t) : ranks(r), timeout_s(t), posted(size_t(r)), arrived_at(size_t(r), 0) {}
  const int ranks;
  const double timeout_s;
  std::mutex mu;
  std::condition_variable cv;
  int64_t generation = 0;
  int waiting = 0;
  std::vector<Posted> posted;
  std::vector<int64_t> arrived_at;  // last generation each rank reached (for the timeout message)

  // Reusable (generation-counting) barrier.
  void barrier(int rank, const char* what) {
    std::unique_lock<std::mutex> lk(mu);
    const int64_t gen = generation;
    arrived_at[size_t(rank)] = gen + 1;
    if (++waiting == ranks) {
      waiting = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    if (!cv.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return generation != gen; })) {
      std::string missing;
      for (int r = 0; r < ranks; ++r)
        if (arrived_at[size_t(r)] <= gen) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail("ThreadComm rank {}: {} timed out after {} s waiting for rank(s) {} (a rank failed or ran a different "
           "sequence of collectives)",
           rank, what, timeout_s, missing);
    }
  }
};

template <typename T>
void add_into(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// dst = Σ_ranks src_r[off : off+n] in rank order.
void rank_order_sum(const Group& g, int64_t off, int64_t n, void* dst, CommType t) {
  const int64_t b = comm_type_bytes(t);
  std::memcpy(dst, static_cast<const char*>(g.posted[0].send) + off * b, size_t(n * b));
  for (int r = 1; r < g.ranks; ++r) {
    const char* src = static_cast<const char*>(g.posted[size_t(r)].send) + off * b;
    if (t == CommType::F32) add_into(static_cast<float*>(dst), reinterpret_cast<const float*>(src), n);
    else add_into(static_cast<int32_t*>(dst), reinterpret_cast<const int32_t*>(src), n);
  }
}

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->ranks; }
  void barrier() override { g_->barrier(rank_, "barrier"); }

  void all_reduce_sum(void* buf, int64_t n, CommType t) override {
    post(buf, nullptr, n, "all_reduce_sum");
    const std::string err = counts_error(n, "all_reduce_sum");
    tmp_.resize(size_t(n * comm_type_bytes(t)));
    if (err.empty()) rank_order_sum(*g_, 0, n, tmp_.data(), t);
    finish("all_reduce_sum", err);  // every peer has read buf
    std::memcpy(buf, tmp_.data(), tmp_.size());
  }

  void all_gather(const void* send, int64_t n, void* recv, CommType t) override {
    post(send, nullptr, n, "all_gather");
    const std::string err = counts_error(n, "all_gather");
    const int64_t b = comm_type_bytes(t);
    for (int r = 0; r < g_->ranks && err.empty(); ++r)
      std::memcpy(static_cast<char*>(recv) + r * n * b, g_->posted[size_t(r)].send, size_t(n * b));
    finish("all_gather", err);
  }

  void all_gatherv(const void* send, const int64_t* counts, void* recv, CommType t) override {
    post(send, counts, counts[rank_], "all_gatherv");
    std::string err;
    for (int r = 0; r < g_->ranks && err.empty(); ++r) err = count_error(r, counts[r], "all_gatherv");
    const int64_t b = comm_type_bytes(t);
    int64_t off = 0;
    for (int r = 0; r < g_->ranks && err.empty(); ++r) {
      char* dst = static_cast<char*>(recv) + off * b;
      if (dst != g_->posted[size_t(r)].send)  // in place: this rank's block already sits in recv
        std::memcpy(dst, g_->posted[size_t(r)].send, size_t(counts[r] * b));
      off += counts[r];
    }
    finish("all_gatherv", err);
  }

  void reduce_scatter_sum(const void* send, int64_t n, void* recv, CommType t) override {
    post(send, nullptr, n, "reduce_scatter_sum");
    const std::string err = counts_error(n, "reduce_scatter_sum");
    if (err.empty()) rank_order_sum(*g_, rank_ * n, n, recv, t);
    finish("reduce_scatter_sum", err);
  }

  void all_to_allv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                   CommType t) override {
    post(send, send_counts, 0, "all_to_allv");
    std::string err;
    for (int q = 0; q < g_->ranks && err.empty(); ++q)
      if (g_->posted[size_t(q)].counts[rank_] != recv_counts[q])
        err = fmt::format("ThreadComm rank {}: all_to_allv expects {} elements from rank {}, which sends {}", rank_,
                          recv_counts[q], q, g_->posted[size_t(q)].counts[rank_]);
    const int64_t b = comm_type_bytes(t);
    int64_t roff = 0;
    for (int q = 0; q < g_->ranks && err.empty(); ++q) {
      const Posted& p = g_->posted[size_t(q)];
      int64_t soff = 0;
      for (int j = 0; j < rank_; ++j) soff += p.counts[j];
      std::memcpy(static_cast<char*>(recv) + roff * b, static_cast<const char*>(p.send) + soff * b,
                  size_t(recv_counts[q] * b));
      roff += recv_counts[q];
    }
    finish("all_to_allv", err);
  }

 private:
  void post(const void* send, const int64_t* counts, int64_t n, const char* what) {
    g_->posted[size_t(rank_)] = Posted{send, counts, n};
    g_->barrier(rank_, what);
  }
  // Counts are checked before any copy. A rank that finds a mismatch still joins the
  // closing barrier before it throws: until then its peers may be reading its buffers.
  std::string count_error(int r, int64_t n, const char* what) const {
    if (g_->posted[size_t(r)].n == n) return {};
    return fmt::format("ThreadComm rank {}: {} of {} elements, but rank {} gives {}", rank_, what, n, r,
                       g_->posted[size_t(r)].n);
  }
  std::string counts_error(int64_t n, const char* what) const {
    for (int r = 0; r < g_->ranks; ++r)
      if (std::string e = count_error(r, n, what); !e.empty()) return e;
    return {};
  }
  void finish(const char* what, const std::string& err) {
    g_->barrier(rank_, what);
    if (!err.empty()) fail("{}", err);
  }

  std::shared_ptr<Group> g_;
  int rank_;
  std::vector<char> tmp_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> make_thread_comms(int ranks, double timeout_s) {
  if (ranks < 1) fail("make_thread_comms: {} ranks (need >= 1)", ranks);
  auto g = std::make_shared<Group>(ranks, timeout_s);
  std::vector<std::unique_ptr<Comm>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_unique<ThreadComm>(g, r));
  return out;
}

void Comm::all_reduce_sum_on(void*, void*, int64_t, CommType) {
  fail("Comm rank {} of {}: this communicator has no stream-ordered collectives (a host communicator; the CUDA "
       "backend's expert parallelism needs a device one)",
       rank(), size());
}

}  // namespace cm
