// The op table's common parts (op_case.h, op_util.h): the Checker, the filter,
// names, the registry and the helpers of the cases.
#include "bench/optable/op_case.h"

#include <cctype>
#include <cstdio>
#include <set>

#include "bench/optable/op_util.h"
#include "common/error.h"
#include "model/config.h"

namespace cm::optable {

void Checker::err(const std::string& what, double err, double bound) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: %.3e (bound %.1e)", what.c_str(), err, bound);
  lines_.push_back(buf);
  const bool good = std::isfinite(err) && err <= bound;
  if (!good) failures_.push_back(std::string(buf) + ": over the bound");
  worst_ = std::max(worst_, bound > 0 ? (std::isfinite(err) ? err / bound : INFINITY) : (err == 0 ? 0.0 : INFINITY));
}

void Checker::expect(bool ok, const std::string& msg) {
  if (!ok) failures_.push_back(msg);
}

void Checker::same_bits(const void* a, const void* b, size_t n, const std::string& what) {
  if (std::memcmp(a, b, n) == 0) return;
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  size_t i = 0;
  while (i < n && pa[i] == pb[i]) ++i;
  failures_.push_back(what + ": bits differ (first at byte " + std::to_string(i) + " of " + std::to_string(n) + ")");
}

int64_t OpCase::param(const std::string& key, int64_t def) const {
  for (const auto& [k, v] : shape)
    if (k == key) return v;
  return def;
}

namespace {

// gtest's pattern match: * any run, ? any one character.
bool glob(const char* p, const char* s) {
  for (;;) {
    if (*p == '\0') return *s == '\0';
    if (*p == '*') {
      for (const char* t = s;; ++t) {
        if (glob(p + 1, t)) return true;
        if (*t == '\0') return false;
      }
    }
    if (*s == '\0' || (*p != '?' && *p != *s)) return false;
    ++p;
    ++s;
  }
}

bool any_of(const std::string& patterns, const std::string& name) {
  size_t start = 0;
  for (;;) {
    const size_t end = patterns.find(':', start);
    const std::string p = patterns.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!p.empty() && glob(p.c_str(), name.c_str())) return true;
    if (end == std::string::npos) return false;
    start = end + 1;
  }
}

}  // namespace

bool match_filter(const std::string& filter, const std::string& name) {
  const size_t dash = filter.find('-');
  const std::string pos = filter.substr(0, dash), neg = dash == std::string::npos ? "" : filter.substr(dash + 1);
  if (!pos.empty() && !any_of(pos, name)) return false;
  return neg.empty() || !any_of(neg, name);
}

namespace {
class FnRun : public OpRun {
 public:
  explicit FnRun(std::function<void(cuda::Context&, Checker&)> fn) : fn_(std::move(fn)) {}
  void run(cuda::Context&, int) override {}
  void check(cuda::Context& ctx, Checker& c) override { fn_(ctx, c); }

 private:
  std::function<void(cuda::Context&, Checker&)> fn_;
};
}  // namespace

std::unique_ptr<OpRun> check_only_run(std::function<void(cuda::Context&, Checker&)> fn) {
  return std::make_unique<FnRun>(std::move(fn));
}

OpCase check_only_case(const std::string& family, const std::string& name,
                       std::function<void(cuda::Context&, Checker&)> fn, const std::string& metric) {
  OpCase c;
  c.family = family;
  c.name = family + "_" + name;
  c.metric = metric;
  c.check_only = true;
  c.bench = false;
  c.make = [fn](cuda::Context&, const MakeOptions&) { return check_only_run(fn); };
  return c;
}

void add_case(std::vector<OpCase>& out, OpCase c) {
  for (const OpCase& o : out)
    if (o.name == c.name) return;
  out.push_back(std::move(c));
}

std::string shape_text(const OpCase& c) {
  std::string s;
  for (const auto& [k, v] : c.shape) s += (s.empty() ? "" : " ") + k + "=" + std::to_string(v);
  return s;
}

std::string case_name(const std::string& prefix, const std::vector<std::pair<std::string, int64_t>>& shape,
                      const std::string& suffix) {
  std::string s = prefix;
  for (const auto& [k, v] : shape) s += "_" + k + (v < 0 ? "m" + std::to_string(-v) : std::to_string(v));
  if (!suffix.empty()) s += "_" + suffix;
  return s;
}

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> v;
    add_linear_cases(v);
    add_pair_cases(v);
    add_moe_cases(v);
    add_basic_cases(v);
    add_fused_cases(v);
    add_attention_cases(v);
    add_sample_cases(v);
    std::set<std::string> seen;
    for (const OpCase& c : v) {
      CM_CHECK(seen.insert(c.name).second, "op table: duplicate case name {}", c.name);
      for (char ch : c.name)
        CM_CHECK(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_', "op table: bad case name {}", c.name);
    }
    return v;
  }();
  return cases;
}

// ---- op_util.h ----

uint8_t random_scale(Rng& r) {
  const uint32_t u = uint32_t(r.next() >> 32);
  const uint32_t kind = u % 64;
  if (kind == 0) return 0x00;                       // zero block
  if (kind == 1) return uint8_t(1 + (u >> 8) % 7);  // subnormal
  uint8_t b = uint8_t(0x28 + (u >> 8) % 0x28);      // normal, about 2^-2 .. 2^3
  if (kind == 2) b |= 0x80;                         // negative scale
  return b;
}

LinearWeight random_nvfp4(int64_t N, int64_t K, uint64_t seed, float scale_2) {
  Rng r(seed);
  LinearWeight w;
  w.name = "test.nvfp4";
  w.format = WeightFormat::NVFP4;
  w.out_features = N;
  w.in_features = K;
  w.owned.resize(size_t(N * K / 2));
  size_t i = 0;
  for (; (i + 1) * 8 <= w.owned.size(); ++i) {
    const uint64_t q = r.next();
    std::memcpy(&w.owned[i * 8], &q, 8);
  }
  for (size_t b = i * 8; b < w.owned.size(); ++b) w.owned[b] = uint8_t(r.next());
  w.owned_scale.resize(size_t(N * K / 16));
  for (auto& s : w.owned_scale) s = random_scale(r);
  w.data = w.owned.data();
  w.scale = w.owned_scale.data();
  w.scale_dtype = DType::F8_E4M3;
  w.scale_rows = N;
  w.scale_cols = K / 16;
  w.scale_2 = scale_2;
  return w;
}

void random_bf16(size_t n, uint64_t seed, float amp, std::vector<uint16_t>& bits, std::vector<float>& vals) {
  Rng r(seed);
  bits = rand_bf16(n, r, amp, &vals);
}

std::vector<uint16_t> rand_bf16(size_t n, Rng& r, float amp, std::vector<float>* vals) {
  std::vector<uint16_t> b(n);
  if (vals) vals->resize(n);
  for (size_t i = 0; i < n; ++i) {
    b[i] = f32_to_bf16((2.f * r.uniform() - 1.f) * amp);
    if (vals) (*vals)[i] = bf16_to_f32(b[i]);
  }
  return b;
}

std::vector<float> rand_f32(size_t n, Rng& r, float amp, float offset) {
  std::vector<float> v(n);
  for (auto& x : v) x = offset + (2.f * r.uniform() - 1.f) * amp;
  return v;
}

std::vector<float> bf16_vals(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b, int64_t* nonfinite) {
  double num = 0, den = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) ++bad;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  if (nonfinite) *nonfinite = bad;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double max_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(double(a[i]) - ref[i]));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

RopeTable make_rope(int64_t rope_dim, bool yarn) {
  RopeConfig rc;
  rc.theta = yarn ? 160000.0 : 10000.0;
  rc.yarn = yarn;
  rc.factor = 16.0;
  rc.original_max_position = 65536.0;
  return RopeTable{rope_frequencies(rc, rope_dim), 1.0f, rope_dim};
}

size_t broken_canaries(const std::vector<uint8_t>& raw, size_t body) {
  size_t bad = 0;
  for (size_t i = 0; i < kGuardBytes && i < raw.size(); ++i) bad += raw[i] != kCanary;
  for (size_t i = kGuardBytes + body; i < raw.size(); ++i) bad += raw[i] != kCanary;
  return bad;
}

GuardedRows::GuardedRows(int64_t M, int64_t N, size_t elem_bytes)
    : M_(M), N_(N), es_(elem_bytes), buf_(2 * kGuardBytes + size_t(M * (N + kCanaryCols)) * elem_bytes) {
  CM_CUDA(cudaMemset(buf_.get(), kCanary, buf_.size()));
  // the rows themselves start as NaN bytes, the canary columns stay canaries
  CM_CUDA(cudaMemset2D(static_cast<char*>(ptr()), size_t(ld()) * es_, 0xFF, size_t(N_) * es_, size_t(M_)));
}

std::vector<uint8_t> GuardedRows::raw(Checker& c, const std::string& what) const {
  std::vector<uint8_t> all(buf_.size());
  CM_CUDA(cudaDeviceSynchronize());
  buf_.download(all.data(), all.size());
  const size_t body = size_t(M_ * ld()) * es_;
  const size_t bad = broken_canaries(all, body);
  c.expect(bad == 0, what + ": " + std::to_string(bad) + " canary bytes before or after the output changed");
  std::vector<uint8_t> rows(size_t(M_ * N_) * es_);
  int64_t bad_rows = 0;
  for (int64_t m = 0; m < M_; ++m) {
    const uint8_t* row = all.data() + kGuardBytes + size_t(m * ld()) * es_;
    std::memcpy(&rows[size_t(m * N_) * es_], row, size_t(N_) * es_);
    for (size_t i = size_t(N_) * es_; i < size_t(ld()) * es_; ++i)
      if (row[i] != kCanary) {
        ++bad_rows;
        break;
      }
  }
  c.expect(bad_rows == 0, what + ": canary columns overwritten in " + std::to_string(bad_rows) + " rows");
  return rows;
}

std::vector<float> GuardedRows::values(Checker& c, const std::string& what) const { return widen(raw(c, what)); }

std::vector<float> GuardedRows::widen(const std::vector<uint8_t>& r) const {
  std::vector<float> v(size_t(M_ * N_));
  for (size_t i = 0; i < v.size(); ++i) {
    if (es_ == 4) {
      std::memcpy(&v[i], &r[i * 4], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &r[i * 2], 2);
      v[i] = bf16_to_f32(b);
    }
  }
  return v;
}

cuda::DeviceBuffer clone(const cuda::DeviceBuffer& b) {
  cuda::DeviceBuffer c(b.size());
  if (b.size()) CM_CUDA(cudaMemcpy(c.get(), b.get(), b.size(), cudaMemcpyDeviceToDevice));
  return c;
}

int rotation_copies(double bytes) { return int(std::clamp(std::ceil(256e6 / std::max(bytes, 1.0)), 1.0, 128.0)); }

}  // namespace cm::optable
