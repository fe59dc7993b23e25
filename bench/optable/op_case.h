// The GPU op table (docs/gpu-ops.md): one list of op test cases that the GPU
// tests check (tests/gpu/test_op_table.cpp, `Table/GpuOp.Check/<name>`) and
// `clawmine bench kernels` times (bench/bench_kernels.cu), modelled on
// llama.cpp's test-backend-ops. A case is a name, a family, its shape
// parameters, a stated error metric and tolerance, and make(): fresh random
// inputs from a seed, uploaded, giving an OpRun whose run() enqueues the op
// alone (the timed call, CUDA-graph capturable) and whose check() runs it into
// guarded outputs (canaries before and after every output buffer, the output
// itself filled with NaN bytes first) and compares against the CPU oracle
// (src/backend/cpu, src/ops, src/quant), recording every failure in a Checker
// (no gtest here: the bench's --check uses the same checks).
// Families register their cases in one file each (linear_cases.cpp, ...);
// all_cases() collects them in a fixed order.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/core/cuda_util.h"

namespace cm::optable {

// The failures and error lines of one check.
class Checker {
 public:
  // One error-table line "what: err (bound b)"; fails when err > bound or err is not finite.
  void err(const std::string& what, double err, double bound);
  // Fails with msg unless ok.
  void expect(bool ok, const std::string& msg);
  // Fails unless the n bytes at a and b are equal (the bit-exactness contracts).
  void same_bits(const void* a, const void* b, size_t n, const std::string& what);
  bool ok() const { return failures_.empty(); }
  const std::vector<std::string>& failures() const { return failures_; }
  const std::vector<std::string>& lines() const { return lines_; }
  double worst() const { return worst_; }  // largest err/bound seen (0 when none)

 private:
  std::vector<std::string> failures_, lines_;
  double worst_ = 0;
};

// One made instance of a case: inputs on the device, ready to run.
class OpRun {
 public:
  virtual ~OpRun() = default;
  // Enqueues the op on ctx's stream with operand set i (0 <= i < copies()): the timed call.
  virtual void run(cuda::Context& ctx, int i) = 0;
  // Runs the op into guarded outputs and compares with the CPU oracle.
  virtual void check(cuda::Context& ctx, Checker& c) = 0;
  // Operand sets run() cycles over (the bench rotates weights past L2); 1 unless made for the bench.
  virtual int copies() const { return 1; }
  // Bytes the op must move (weights + activations + outputs) and its flops, for the bench's rates.
  virtual double bytes() const { return 0; }
  virtual double flops() const { return 0; }
  // Bytes of weight one call reads (the copy floor the bench measures); 0 = none.
  virtual double weight_bytes() const { return 0; }
  // The kernel that serves the call (as the dispatcher names it), "" when there is one.
  virtual std::string path() const { return ""; }
};

struct MakeOptions {
  uint64_t seed = 1;
  bool bench = false;  // made for timing: may hold several operand sets (copies()), check() need not work
};

struct OpCase {
  std::string name;    // unique, [A-Za-z0-9_] (a gtest parameter name)
  std::string family;  // e.g. "linear_nvfp4", "moe", "norm"
  std::vector<std::pair<std::string, int64_t>> shape;
  std::string metric;  // the error metric, e.g. "||d||/||ref||"; "bits" for bit-exactness
  double tol = 0;      // the tolerance of that metric (0: exact)
  bool huge = false;        // long check: the default test run samples these (see docs/gpu-ops.md)
  bool bench = true;        // in `bench kernels`' default selection (V4-Flash shapes; --only reaches every case)
  bool check_only = false;  // no timed op (dispatch, determinism, chained launches): never timed
  std::function<std::unique_ptr<OpRun>(cuda::Context&, const MakeOptions&)> make;
  // Host-only cases (packing, upload refusals) set this instead of make: no device needed.
  std::function<void(Checker&)> host_check;

  int64_t param(const std::string& key, int64_t def = 0) const;
};

// Every case of every family, in a fixed order (built once).
const std::vector<OpCase>& all_cases();

// gtest-style filter: "POS1:POS2-NEG1:NEG2" with * and ?; an empty filter matches everything.
bool match_filter(const std::string& filter, const std::string& name);

// A check-only case's instance: check() calls fn, run() does nothing.
std::unique_ptr<OpRun> check_only_run(std::function<void(cuda::Context&, Checker&)> fn);

// A check-only case named family_name whose check is fn (metric: what it compares).
OpCase check_only_case(const std::string& family, const std::string& name,
                       std::function<void(cuda::Context&, Checker&)> fn, const std::string& metric = "bits");

// Appends c unless a case of that name is already there (grids of the tests and of the bench overlap).
void add_case(std::vector<OpCase>& out, OpCase c);

// "key1=v1 key2=v2" of a case's shape.
std::string shape_text(const OpCase& c);

// A case name from a prefix and its shape: prefix_KEYvalue_KEYvalue (values' '-' as 'm').
std::string case_name(const std::string& prefix, const std::vector<std::pair<std::string, int64_t>>& shape,
                      const std::string& suffix = "");

// Per-family registration (one file each).
void add_linear_cases(std::vector<OpCase>& out);
void add_moe_cases(std::vector<OpCase>& out);
void add_basic_cases(std::vector<OpCase>& out);
void add_pair_cases(std::vector<OpCase>& out);
void add_fused_cases(std::vector<OpCase>& out);
void add_attention_cases(std::vector<OpCase>& out);
void add_sample_cases(std::vector<OpCase>& out);

}  // namespace cm::optable
