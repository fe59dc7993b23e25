// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}).
//
// Merges may be "a b" strings (older files) or ["a", "b"] pairs (newer); the merge rank is the
// array index. Encoding a pre-token applies the lowest-ranked applicable merge first (leftmost on
// equal rank) with a priority queue over a linked list of symbols, and caches the result per
// pre-token. Byte-level vocabularies start from the GPT-2 byte chars of the raw bytes; others from
// the UTF-8 characters (unknown ones via byte_fallback <0xXX> tokens, then unk_token, else dropped,
// as HF does).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cm::tok {

class Bpe {
 public:
  // `model` is tokenizer.json's "model" value; `byte_level` says whether the pre-tokenizer is
  // ByteLevel (pieces arrive as raw bytes and are mapped to GPT-2 byte chars here).
  void load(const nlohmann::json& model, bool byte_level);

  // Appends the ids of one pre-token.
  void encode_word(std::string_view piece, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  size_t num_merges() const { return merges_.size(); }

 private:
  void initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const;
  void merge(std::vector<int32_t>& syms) const;

  std::unordered_map<std::string, int32_t> vocab_;
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  std::unordered_map<uint64_t, uint64_t> merges_;
  bool byte_level_ = false, ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false;
  int32_t unk_id_ = -1;
  int32_t byte_id_[256];      // byte-level: id of each byte's char (-1 if absent)
  int32_t fallback_id_[256];  // byte_fallback: id of <0xXX> (-1 if absent)

  // Per pre-token cache (bounded; cleared when full). Guarded so encode is thread-safe.
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace cm::tok
