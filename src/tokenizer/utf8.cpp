// UTF-8 helpers; see utf8.h.
#include "tokenizer/utf8.h"

namespace cm::utf8 {

namespace {
inline bool cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Allowed range of the second byte for a lead byte (Unicode Table 3-7); {0,0} = invalid lead.
struct Range {
  unsigned char lo, hi;
  int len;
};
Range lead_info(unsigned char c) {
  if (c < 0x80) return {0, 0, 1};
  if (c >= 0xC2 && c <= 0xDF) return {0x80, 0xBF, 2};
  if (c == 0xE0) return {0xA0, 0xBF, 3};
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return {0x80, 0xBF, 3};
  if (c == 0xED) return {0x80, 0x9F, 3};  // no surrogates
  if (c == 0xF0) return {0x90, 0xBF, 4};
  if (c >= 0xF1 && c <= 0xF3) return {0x80, 0xBF, 4};
  if (c == 0xF4) return {0x80, 0x8F, 4};  // <= U+10FFFF
  return {0, 0, 0};
}
}  // namespace

size_t valid_seq_len(std::string_view s, size_t i) {
  unsigned char c = s[i];
  Range r = lead_info(c);
  if (r.len <= 1) return r.len;
  if (i + r.len > s.size()) return 0;
  unsigned char c1 = s[i + 1];
  if (c1 < r.lo || c1 > r.hi) return 0;
  for (int k = 2; k < r.len; ++k)
    if (!cont(s[i + k])) return 0;
  return r.len;
}

bool incomplete_prefix(std::string_view s, size_t i) {
  Range r = lead_info(s[i]);
  if (r.len <= 1) return false;
  size_t have = s.size() - i;
  if (have >= static_cast<size_t>(r.len)) return false;
  if (have >= 2) {
    unsigned char c1 = s[i + 1];
    if (c1 < r.lo || c1 > r.hi) return false;
  }
  for (size_t k = 2; k < have; ++k)
    if (!cont(s[i + k])) return false;
  return true;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t decode(std::string_view s, size_t i, size_t n) {
  auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

// Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes are
// numbered 256, 257, ... in byte order (the GPT-2 convention every byte-level vocabulary uses).
static ByteLevelTable make_table() {
  ByteLevelTable t{};
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!printable) t.high_to_byte[next - 256] = static_cast<uint8_t>(b);
    t.byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
    append(t.byte_to_str[b], t.byte_to_cp[b]);
  }
  return t;
}

int ByteLevelTable::byte_of_cp(uint32_t cp) const {
  if (cp < 256) {
    bool printable = (cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE);
    return printable ? static_cast<int>(cp) : -1;
  }
  return cp < 256 + 68 ? high_to_byte[cp - 256] : -1;
}

const ByteLevelTable& byte_level() {
  static const ByteLevelTable t = make_table();
  return t;
}

std::string to_byte_level(std::string_view raw) {
  const auto& t = byte_level();
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) out += t.byte_to_str[c];
  return out;
}

bool from_byte_level(std::string_view s, std::string& out) {
  const auto& t = byte_level();
  for (size_t i = 0; i < s.size();) {
    size_t n = valid_seq_len(s, i);
    if (n == 0) return false;
    int b = t.byte_of_cp(decode(s, i, n));
    if (b < 0) return false;
    out += static_cast<char>(b);
    i += n;
  }
  return true;
}

}  // namespace cm::utf8
