#include "runtime/sizing.h"

#include <algorithm>
#include <cstdio>

namespace cm::runtime {

namespace {
std::string gib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", double(b) / double(size_t(1) << 30));
  return s;
}
}  // namespace

Sizing size_reservation(const ModelBackend& be, const SizingRequest& r) {
  Sizing out;
  CacheShape& s = out.shape;
  const size_t budget = be.reserve_budget();
  const bool gpu = budget != SIZE_MAX;
  s.max_step_tokens = r.max_step_tokens > 0 ? r.max_step_tokens : gpu ? kGpuMaxStepTokens : kCpuMaxStepTokens;
  s.max_ctx = r.ctx > 0 ? r.ctx : std::min<int64_t>(r.model_ctx, gpu ? kGpuCtx : kCpuCtx);
  if (!gpu) {
    s.max_slots = r.max_seqs > 0 ? r.max_seqs : kCpuMaxSeqs;
    if (r.max_step_tokens <= 0) s.max_step_tokens = std::max(s.max_step_tokens, s.max_slots);
    return out;
  }
  auto fits = [&](int32_t seqs, int64_t ctx) {
    CacheShape t{seqs, s.max_step_tokens, ctx};
    return be.reserve_bytes(t) <= budget;
  };
  const int32_t least = r.max_seqs > 0 ? r.max_seqs : 1;
  // The context: as asked, else halved from the default until `least` slots fit.
  const int64_t floor_ctx = std::min<int64_t>(kGpuMinCtx, r.model_ctx);
  if (r.ctx <= 0)
    while (!fits(least, s.max_ctx) && s.max_ctx / 2 >= floor_ctx) s.max_ctx /= 2;
  if (r.max_seqs > 0) {
    s.max_slots = r.max_seqs;
  } else {
    // The most slots that fit, at most kGpuMaxSeqs and never more than a step's tokens.
    const int32_t cap = std::min<int32_t>(kGpuMaxSeqs, s.max_step_tokens);
    int32_t lo = 1, hi = cap;
    if (!fits(1, s.max_ctx)) {
      hi = 1;  // not even one: reserve() names what does not fit
    } else {
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (fits(mid, s.max_ctx)) lo = mid;
        else hi = mid - 1;
      }
    }
    s.max_slots = lo;
  }
  const size_t per_slot = be.bytes_per_slot(s);
  out.why = "sized to the device: " + std::to_string(s.max_slots) + " slots of " + std::to_string(s.max_ctx) +
            " tokens (" + gib(per_slot) + " of state each) and " + std::to_string(s.max_step_tokens) +
            "-token steps in the " + gib(budget) + " left after the weights" +
            (r.max_seqs > 0 || r.max_step_tokens > 0 || r.ctx > 0 ? " (the values given on the command line kept)" : "");
  return out;
}

}  // namespace cm::runtime
