// BPE model implementation; see bpe.h.
#include "tokenizer/bpe.h"

#include <nlohmann/json.hpp>

#include <queue>

#include "common/error.h"
#include "tokenizer/utf8.h"

namespace cm::tok {

namespace {
constexpr size_t kCacheCapacity = 1 << 17;
constexpr size_t kCacheMaxWord = 256;  // longer pre-tokens are rare and not worth caching
inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

void Bpe::load(const nlohmann::json& model, bool byte_level) {
  CM_CHECK(model.is_object(), "tokenizer.json: missing \"model\"");
  std::string type = model.value("type", std::string("BPE"));
  CM_CHECK(type == "BPE", "tokenizer.json: model type '{}' is not supported (only BPE)", type);
  auto nonempty = [&](const char* key) {
    return model.contains(key) && !model[key].is_null() && model[key] != "";
  };
  CM_CHECK(!nonempty("continuing_subword_prefix") && !nonempty("end_of_word_suffix"),
           "tokenizer.json: BPE continuing_subword_prefix/end_of_word_suffix are not supported");
  CM_CHECK(!model.contains("dropout") || model["dropout"].is_null() || model["dropout"] == 0.0,
           "tokenizer.json: BPE dropout is not supported for inference");
  byte_level_ = byte_level;
  ignore_merges_ = model.value("ignore_merges", false);
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);

  const auto& vocab = model.at("vocab");
  CM_CHECK(vocab.is_object(), "tokenizer.json: model.vocab must be an object");
  vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    CM_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                 it.value().get<int64_t>() < INT32_MAX,
             "tokenizer.json: vocab entry '{}' has an invalid id", it.key());
    vocab_.emplace(it.key(), it.value().get<int32_t>());
  }
  auto find = [&](const std::string& s) {
    auto it = vocab_.find(s);
    return it == vocab_.end() ? -1 : it->second;
  };
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    unk_id_ = find(model["unk_token"].get<std::string>());
    CM_CHECK(unk_id_ >= 0, "tokenizer.json: unk_token '{}' is not in the vocabulary",
             model["unk_token"].get<std::string>());
  }
  for (int b = 0; b < 256; ++b) {
    byte_id_[b] = find(utf8::byte_level().byte_to_str[b]);
    fallback_id_[b] = find(fmt::format("<0x{:02X}>", b));
  }

  const auto& merges = model.at("merges");
  CM_CHECK(merges.is_array(), "tokenizer.json: model.merges must be an array");
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& m = merges[r];
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      CM_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
               "tokenizer.json: merge {} '{}' is not two tokens separated by one space", r, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      CM_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               "tokenizer.json: merge {} is neither \"a b\" nor [\"a\", \"b\"]", r);
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    int32_t ia = find(a), ib = find(b), im = find(a + b);
    CM_CHECK(ia >= 0 && ib >= 0, "tokenizer.json: merge {} uses a token not in the vocabulary ('{}' '{}')",
             r, a, b);
    CM_CHECK(im >= 0, "tokenizer.json: merge {} result '{}' is not in the vocabulary", r, a + b);
    // A repeated pair keeps its first (lowest) rank.
    merges_.emplace(pair_key(ia, ib), (static_cast<uint64_t>(r) << 32) | static_cast<uint32_t>(im));
  }
}

void Bpe::initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const {
  syms.clear();
  if (byte_level_) {
    for (unsigned char c : piece) {
      int32_t id = byte_id_[c];
      if (id >= 0) syms.push_back(id);
      else if (unk_id_ >= 0 && !(fuse_unk_ && !syms.empty() && syms.back() == unk_id_)) syms.push_back(unk_id_);
    }
    return;
  }
  for (size_t i = 0; i < piece.size();) {
    size_t n = utf8::valid_seq_len(piece, i);
    if (n == 0) n = 1;
    auto it = vocab_.find(std::string(piece.substr(i, n)));
    if (it != vocab_.end()) {
      syms.push_back(it->second);
    } else {
      bool done = false;
      if (byte_fallback_) {
        done = true;
        for (size_t k = 0; k < n; ++k) done = done && fallback_id_[static_cast<unsigned char>(piece[i + k])] >= 0;
        if (done)
          for (size_t k = 0; k < n; ++k) syms.push_back(fallback_id_[static_cast<unsigned char>(piece[i + k])]);
      }
      if (!done && unk_id_ >= 0 && !(fuse_unk_ && !syms.empty() && syms.back() == unk_id_))
        syms.push_back(unk_id_);
    }
    i += n;
  }
}

// Lowest rank first, leftmost on ties; stale queue entries are detected by re-looking up the pair.
void Bpe::merge(std::vector<int32_t>& syms) const {
  const size_t n = syms.size();
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  // Key: rank in the high 32 bits, position in the low 32 bits -> min-heap order = (rank, pos).
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> pq;
  auto push = [&](int32_t i) {
    int32_t j = next[i];
    if (j < 0) return;
    auto it = merges_.find(pair_key(syms[i], syms[j]));
    if (it != merges_.end()) pq.push((it->second & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(i));
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!pq.empty()) {
    uint64_t top = pq.top();
    pq.pop();
    int32_t i = static_cast<int32_t>(top & 0xFFFFFFFFu);
    uint64_t rank = top >> 32;
    if (syms[i] < 0) continue;  // merged away
    int32_t j = next[i];
    if (j < 0) continue;
    auto it = merges_.find(pair_key(syms[i], syms[j]));
    if (it == merges_.end() || (it->second >> 32) != rank) continue;  // stale
    syms[i] = static_cast<int32_t>(it->second & 0xFFFFFFFFu);
    syms[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (syms[i] >= 0) syms[w++] = syms[i];
  syms.resize(w);
}

void Bpe::encode_word(std::string_view piece, std::vector<int32_t>& out) const {
  const bool cacheable = piece.size() <= kCacheMaxWord;
  std::string key;
  if (cacheable) {
    key.assign(piece);
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> syms;
  bool whole = false;
  if (ignore_merges_) {
    auto it = vocab_.find(byte_level_ ? utf8::to_byte_level(piece) : std::string(piece));
    if (it != vocab_.end()) syms.push_back(it->second), whole = true;
  }
  if (!whole) {
    initial_symbols(piece, syms);
    merge(syms);
  }
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::move(key), std::move(syms));
  }
}

}  // namespace cm::tok
