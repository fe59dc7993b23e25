// Sampling rows of logits on the CPU (ops/sample.h): the GPU kernel's algorithm step by step, with the
// shared arithmetic of ops/sample_math.h, so both give the same token for the same row. The raw
// logprob's sums run in another order than the GPU's (its tolerance is stated in the tests).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "ops/sample.h"
#include "ops/sample_math.h"

namespace cm {

void check_sample_params(const SampleParams& p) {
  CM_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "sample: temperature {} must be finite and >= 0",
           double(p.temperature));
  CM_CHECK(p.top_p > 0 && p.top_p <= 1, "sample: top_p {} must be in (0, 1]", double(p.top_p));
  CM_CHECK(p.min_p >= 0 && p.min_p <= 1, "sample: min_p {} must be in [0, 1]", double(p.min_p));
  CM_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0,
           "sample: repetition_penalty {} must be finite and > 0", double(p.repetition_penalty));
  CM_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty),
           "sample: presence_penalty and frequency_penalty must be finite");
}

namespace {

namespace sm = sample_math;

// The adjusted logit (ops/sample.h step 3).
float adjust(float l, const SampleAdjust& e, const SampleParams& p) {
  float a = sm::add_rn(l, e.bias);
  if (e.count > 0) {
    if (p.repetition_penalty != 1.0f)
      a = a > 0 ? sm::div_rn(a, p.repetition_penalty) : sm::mul_rn(a, p.repetition_penalty);
    const float pen = sm::add_rn(sm::mul_rn(float(e.count), p.frequency_penalty), p.presence_penalty);
    a = sm::sub_rn(a, pen);
  }
  return a;
}

bool allowed(const uint32_t* mask, int64_t id) { return !mask || (mask[id >> 5] >> (id & 31)) & 1u; }

// Radix select over the weights w >= floor_w, as the GPU kernel does it (8 bits a round, most
// significant first): by_mass = false gives the goal-th largest weight, by_mass = true the largest t
// with sum(w >= t) >= goal. O(vocab) per round; integer sums, so the result is exact.
uint32_t radix_select(const std::vector<uint32_t>& w, uint32_t floor_w, uint64_t goal, bool by_mass) {
  uint32_t prefix = 0, pmask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint64_t hist[256] = {};
    for (uint32_t v : w)
      if (v >= floor_w && (v & pmask) == prefix) hist[(v >> shift) & 255u] += by_mass ? v : 1;
    int b = 255;
    for (; b > 0 && hist[b] < goal; --b) goal -= hist[b];
    prefix |= uint32_t(b) << shift;
    pmask |= 255u << shift;
  }
  return prefix;
}

void sample_row(float* x, int64_t V, const SampleParams& p, SampleAdjust* adj, int64_t n_adj, const uint32_t* mask,
                int32_t& token, float& logprob, int32_t& status, int32_t top_n, int32_t* top_id, float* top_lp) {
  token = -1;
  logprob = std::numeric_limits<float>::quiet_NaN();
  for (int32_t k = 0; k < top_n; ++k) top_id[k] = -1, top_lp[k] = std::numeric_limits<float>::quiet_NaN();
  // 1-2. non-finite check and the raw distribution's statistics
  float m_raw = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity()) {
      status = kSampleNonFinite;
      return;
    }
    m_raw = std::max(m_raw, x[i]);
  }
  double s_raw = 0;
  for (int64_t i = 0; i < V; ++i) s_raw += std::exp(double(x[i]) - double(m_raw));
  const auto raw_logprob = [&](float v) { return float(double(v) - double(m_raw) - std::log(s_raw)); };
  if (top_n > 0) {  // 2b. the raw top_n (value descending, lowest id on ties)
    std::vector<int32_t> ids(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) ids[size_t(i)] = int32_t(i);
    const size_t k = std::min(size_t(top_n), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(),
                      [&](int32_t a, int32_t b) { return x[a] != x[b] ? x[a] > x[b] : a < b; });
    for (size_t j = 0; j < k; ++j) top_id[j] = ids[j], top_lp[j] = raw_logprob(x[ids[j]]);
  }
  // 3. adjustments, in place (distinct ids: the GPU applies them in parallel)
  {
    std::vector<int32_t> ids(static_cast<size_t>(n_adj));
    for (int64_t j = 0; j < n_adj; ++j) ids[size_t(j)] = adj[j].id;
    std::sort(ids.begin(), ids.end());
    const auto dup = std::adjacent_find(ids.begin(), ids.end());
    CM_CHECK(dup == ids.end(), "sample: id {} is adjusted twice in one row", *dup);
  }
  for (int64_t j = 0; j < n_adj; ++j) {
    SampleAdjust& e = adj[j];
    CM_CHECK(e.id >= 0 && e.id < V, "sample: adjustment id {} outside the vocabulary [0, {})", e.id, (long long)V);
    CM_CHECK(std::isfinite(e.bias) && e.count >= 0, "sample: adjustment of id {}: bias {}, count {}", e.id,
             double(e.bias), e.count);
    e.orig = x[e.id];
    x[e.id] = adjust(e.orig, e, p);
  }
  // 4-5. the largest allowed adjusted logit (lowest id on ties)
  int64_t best = -1;
  for (int64_t i = 0; i < V; ++i)
    if (allowed(mask, i) && x[i] > -std::numeric_limits<float>::infinity() && (best < 0 || x[i] > x[best])) best = i;
  if (best < 0 || std::isnan(x[best]) || std::isinf(x[best])) {
    status = best < 0 ? kSampleNothingAllowed : kSampleNonFinite;  // an adjustment overflowed to inf / NaN
    return;
  }
  status = kSampleOk;
  if (p.temperature == 0.0f) {
    token = int32_t(best);
  } else {
    // 6. integer weights and the thresholds
    const float m = x[best];
    std::vector<uint32_t> w(size_t(V), 0);
    for (int64_t i = 0; i < V; ++i)
      if (allowed(mask, i)) w[size_t(i)] = sm::weight(x[i], m, p.temperature);
    uint32_t thr = 1;
    if (p.top_k > 0 && p.top_k < V) thr = std::max(thr, radix_select(w, 0, uint64_t(p.top_k), false));
    if (p.top_p < 1.0f) {
      uint64_t z = 0;
      for (uint32_t v : w)
        if (v >= thr) z += v;
      const uint64_t target = uint64_t(std::ceil(double(p.top_p) * double(z)));
      thr = std::max(thr, radix_select(w, thr, target, true));
    }
    if (p.min_p > 0.0f) thr = std::max(thr, uint32_t(std::ceil(double(p.min_p) * 2147483648.0)));
    // 7. the draw, walking the kept weights in id order
    uint64_t z = 0;
    for (uint32_t v : w)
      if (v >= thr) z += v;
    const uint64_t r = sm::scale_draw(sm::philox_u64(p.seed, p.counter), z);
    uint64_t acc = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (w[size_t(i)] < thr) continue;
      acc += w[size_t(i)];
      if (acc > r) {
        token = int32_t(i);
        break;
      }
    }
  }
  // the chosen token's raw logit (an adjusted id's original)
  float raw = x[token];
  for (int64_t j = 0; j < n_adj; ++j)
    if (adj[j].id == token) raw = adj[j].orig;
  logprob = raw_logprob(raw);
}

}  // namespace

void sample_rows_cpu(const SampleArgs& a) {
  CM_CHECK(a.rows >= 0 && a.vocab > 0 && a.vocab < (int64_t(1) << 31), "sample: {} rows of vocabulary {}",
           (long long)a.rows, (long long)a.vocab);
  CM_CHECK(!a.mask || a.mask_words * 32 >= a.vocab, "sample: {} mask words cannot cover a vocabulary of {}",
           (long long)a.mask_words, (long long)a.vocab);
  CM_CHECK(a.logits && a.params && a.token && a.logprob && a.status, "sample: a null array");
  CM_CHECK(!a.adj_offsets == !a.adj, "sample: adjustments need both adj and adj_offsets");
  CM_CHECK(a.top_n >= 0 && a.top_n <= kMaxSampleTopN && (a.top_n == 0 || (a.top_id && a.top_logprob)),
           "sample: top_n {} must be in [0, {}] with its output arrays", a.top_n, kMaxSampleTopN);
  for (int64_t r = 0; r < a.rows; ++r) {
    check_sample_params(a.params[r]);
    int64_t n_adj = 0;
    SampleAdjust* adj = nullptr;
    if (a.adj_offsets) {
      CM_CHECK(a.adj_offsets[r] >= 0 && a.adj_offsets[r + 1] >= a.adj_offsets[r],
               "sample: adjustment offsets of row {} go backwards", (long long)r);
      n_adj = a.adj_offsets[r + 1] - a.adj_offsets[r];
      adj = a.adj + a.adj_offsets[r];
    }
    sample_row(a.logits + r * a.vocab, a.vocab, a.params[r], adj, n_adj,
               a.mask ? a.mask + r * a.mask_words : nullptr, a.token[r], a.logprob[r], a.status[r], a.top_n,
               a.top_id + r * a.top_n, a.top_logprob + r * a.top_n);
  }
}

}  // namespace cm
