// Calibration run for the quantizer; see calibrate.h.
#include "runtime/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <climits>
#include <iterator>
#include <sstream>

#include "common/error.h"
#include "seam/backend.h"
#include "io/input_file.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "factory/factory.h"

namespace cm {

namespace {

// Records max |x| of each linear's input, keyed by the weight's module name.
struct AmaxRecorder : LinearInputObserver {
  std::map<std::string, float> amax;
  void observe_input(const LinearWeight& w, const float* x, int64_t m, int64_t ldx) override {
    float a = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < w.in_features; ++k) a = std::max(a, std::fabs(x[i * ldx + k]));  // NaN does not raise it
    float& slot = amax[w.name];
    slot = std::max(slot, a);
  }
};

}  // namespace

namespace {

// Parses token-id lines; returns false (and the first offending item) when an
// item is not a token id.
bool parse_id_lines(const std::string& text, std::vector<std::vector<int32_t>>* seqs, std::string* bad,
                    int64_t* bad_line) {
  std::istringstream lines(text);
  std::string line;
  int64_t lineno = 0;
  while (std::getline(lines, line)) {
    ++lineno;
    for (char& c : line)
      if (c == ',' || c == '\t' || c == '\r') c = ' ';
    std::istringstream is(line);
    std::vector<int32_t> ids;
    std::string tok;
    while (is >> tok) {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(tok.c_str(), &end, 10);
      if (*end != '\0' || errno || v < 0 || v > INT32_MAX) {
        *bad = tok;
        *bad_line = lineno;
        return false;
      }
      ids.push_back(int32_t(v));
    }
    if (!ids.empty()) seqs->push_back(std::move(ids));
  }
  return true;
}

}  // namespace

std::vector<std::vector<int32_t>> read_calibration(const std::string& path, const std::string& model_dir,
                                                   CalibFormat format) {
  const std::string text = read_regular_file(path, kMaxTextBytes, "--calib");
  std::vector<std::vector<int32_t>> seqs;
  std::string bad;
  int64_t bad_line = 0;
  if (format != CalibFormat::TEXT && parse_id_lines(text, &seqs, &bad, &bad_line)) {
    if (seqs.empty()) fail("--calib '{}' holds no token ids", path);
    return seqs;
  }
  if (format == CalibFormat::IDS)
    fail("--calib '{}' line {}: '{}' is not a token id (the file holds token ids, one sequence per line)", path,
         bad_line, truncate_text(bad, 40));
  // Text: the model's own tokenizer.
  std::vector<int32_t> ids;
  try {
    ids = Tokenizer::load(model_dir).encode(text);
  } catch (const Error& e) {
    fail("--calib '{}' is text (not token ids) and needs the model's tokenizer: {}", path, e.what());
  }
  if (ids.empty()) fail("--calib '{}' holds no text", path);
  return {ids};
}

std::map<std::string, float> calibrate_input_amax(const std::string& dir,
                                                  const std::vector<std::vector<int32_t>>& seqs, int64_t max_len,
                                                  std::FILE* log) {
  CM_CHECK(max_len > 0, "--calib-seq-len must be >= 1 (got {})", max_len);
  LoadOptions lo;
  lo.linear.allow_missing_input_scale = true;
  std::unique_ptr<Model> m = model_load(dir, lo);
  AmaxRecorder rec;
  BackendOptions bo;
  bo.linear_inputs = &rec;
  std::unique_ptr<ModelBackend> be = make_backend(*m, Device::CPU, bo);
  const int64_t len = std::min(max_len, m->config.max_position_embeddings);
  be->reserve(CacheShape{1, int32_t(len), len});
  std::vector<int32_t> pos(static_cast<size_t>(len)), slot(size_t(len), 0);
  std::vector<uint8_t> want(size_t(len), 0);  // no logits: only the linears' inputs are wanted
  for (int64_t i = 0; i < len; ++i) pos[size_t(i)] = int32_t(i);
  int64_t total = 0, done = 0;
  for (const auto& s : seqs) total += int64_t(s.size());
  for (const auto& s : seqs) {
    for (size_t i = 0; i < s.size(); i += size_t(len)) {
      be->reset_slot(0);
      const int64_t n = std::min<int64_t>(len, int64_t(s.size() - i));
      be->step(Batch{int32_t(n), s.data() + i, pos.data(), slot.data(), want.data()}, nullptr);
      done += n;
      std::fprintf(log, "calibrate: %lld/%lld tokens\n", (long long)done, (long long)total);
    }
  }
  return rec.amax;
}

}  // namespace cm
