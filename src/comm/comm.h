// Collectives between the ranks of one model (expert parallelism).
//
// Comm is the one interface the engine talks to; two implementations:
//   ThreadComm  in-process threads standing in for 2–8 ranks (CPU tests, CI):
//               every rank is a std::thread holding its own Comm of one group.
//   NcclComm    one process per GPU over NCCL (backend/cuda/comm/comm_nccl.cpp, only
//               in CUDA builds with NCCL); buffers are device pointers there.
// Every collective is called by every rank of the group in the same order
// (NCCL's rule); a call returns when the rank's output buffer is complete.
// Results are deterministic: sums add the ranks' values in rank order
// (0, 1, …, R−1), so a value held by one rank and zeros elsewhere comes back
// bit-exact. Element counts are per rank; "v" variants take counts per peer
// and pack the blocks contiguously in rank order.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace cm {

enum class CommType : uint8_t { F32, I32 };
inline int64_t comm_type_bytes(CommType) { return 4; }

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;

  // buf[n] = Σ_ranks buf[n]
  virtual void all_reduce_sum(void* buf, int64_t n, CommType t) = 0;
  // recv[R·n]: rank i's send[n] at block i
  virtual void all_gather(const void* send, int64_t n, void* recv, CommType t) = 0;
  // recv[Σ counts]: rank i's send[counts[i]] at offset Σ_{j<i} counts[j]; n = counts[rank]
  virtual void all_gatherv(const void* send, const int64_t* counts, void* recv, CommType t) = 0;
  // send[R·n]; recv[n] = Σ_ranks send block `rank`
  virtual void reduce_scatter_sum(const void* send, int64_t n, void* recv, CommType t) = 0;
  // send packs send_counts[q] elements for each peer q in order; recv gets recv_counts[q]
  // from each peer q in order (recv_counts[q] must equal peer q's send_counts[rank]).
  virtual void all_to_allv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                           CommType t) = 0;

  // Stream order (device communicators only: NcclComm, the in-process DeviceComm): enqueue
  // buf[n] = Σ_ranks buf[n] on the CUDA stream `stream` (a cudaStream_t) and return at once; the
  // sum is in buf when the stream gets past it. Every rank enqueues the same calls in the same
  // order; a CUDA graph may capture them (no host synchronisation). Host communicators
  // (ThreadComm) have none: stream_ordered() is false and the call is an error.
  virtual bool stream_ordered() const { return false; }
  virtual void all_reduce_sum_on(void* stream, void* buf, int64_t n, CommType t);

  // Typed conveniences.
  void all_reduce_sum(float* b, int64_t n) { all_reduce_sum(b, n, CommType::F32); }
  void all_reduce_sum(int32_t* b, int64_t n) { all_reduce_sum(b, n, CommType::I32); }
  void all_gather(const float* s, int64_t n, float* r) { all_gather(s, n, r, CommType::F32); }
  void all_gather(const int32_t* s, int64_t n, int32_t* r) { all_gather(s, n, r, CommType::I32); }
  void all_gatherv(const float* s, const int64_t* c, float* r) { all_gatherv(s, c, r, CommType::F32); }
  void all_gatherv(const int32_t* s, const int64_t* c, int32_t* r) { all_gatherv(s, c, r, CommType::I32); }
  void reduce_scatter_sum(const float* s, int64_t n, float* r) { reduce_scatter_sum(s, n, r, CommType::F32); }
  void reduce_scatter_sum(const int32_t* s, int64_t n, int32_t* r) { reduce_scatter_sum(s, n, r, CommType::I32); }
  void all_to_allv(const float* s, const int64_t* sc, float* r, const int64_t* rc) {
    all_to_allv(s, sc, r, rc, CommType::F32);
  }
  void all_to_allv(const int32_t* s, const int64_t* sc, int32_t* r, const int64_t* rc) {
    all_to_allv(s, sc, r, rc, CommType::I32);
  }
  // n elements to and from every peer.
  template <typename T>
  void all_to_all(const T* s, int64_t n, T* r) {
    std::vector<int64_t> c(size_t(size()), n);
    all_to_allv(s, c.data(), r, c.data());
  }
};

// R ranks in this process: make_thread_comms(R)[r] is rank r's Comm, to be used
// by one thread each (they share one group; a rank that throws leaves the others
// waiting until timeout_s, then they fail naming the ranks that never arrived).
std::vector<std::unique_ptr<Comm>> make_thread_comms(int ranks, double timeout_s = 120);

// Which rank owns global expert e of E split over R ranks: rank r owns
// [r·E/R, (r+1)·E/R) (integer division; E % R != 0 gives ranks uneven ranges).
inline int64_t expert_first(int64_t E, int rank, int ranks) { return int64_t(rank) * E / ranks; }
inline int expert_owner(int64_t E, int64_t e, int ranks) {
  int r = int(e * ranks / E);  // guess, then correct for the floor in expert_first
  while (r + 1 < ranks && expert_first(E, r + 1, ranks) <= e) ++r;
  while (r > 0 && expert_first(E, r, ranks) > e) --r;
  return r;
}

}  // namespace cm
