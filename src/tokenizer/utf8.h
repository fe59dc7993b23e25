// UTF-8 helpers and the GPT-2 byte<->unicode table used by byte-level BPE.
// Why hand-written: they are tiny, and the tokenizer needs exact control over how invalid
// UTF-8 is segmented (see tokenizer.h for the documented behaviour).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cm::utf8 {

// Length (1-4) of the valid, complete UTF-8 sequence starting at s[i], or 0 when the byte at i
// does not start one (stray continuation byte, overlong form, surrogate, > U+10FFFF, truncated).
// This is the strict decoder Python's "utf-8" codec uses, so the segmentation matches
// bytes.decode("utf-8", "surrogateescape") byte for byte.
size_t valid_seq_len(std::string_view s, size_t i);

// True when s[i..] starts with a prefix of a valid sequence that more bytes could complete.
bool incomplete_prefix(std::string_view s, size_t i);

// Appends the UTF-8 encoding of code point cp.
void append(std::string& out, uint32_t cp);

// Decodes the valid sequence of length n at s[i] (n from valid_seq_len).
uint32_t decode(std::string_view s, size_t i, size_t n);

// GPT-2 byte-level table: each byte is represented by one printable code point.
struct ByteLevelTable {
  std::array<uint32_t, 256> byte_to_cp;
  std::array<std::string, 256> byte_to_str;  // UTF-8 of byte_to_cp
  std::array<uint8_t, 68> high_to_byte;      // byte of code point 256 + i
  int byte_of_cp(uint32_t cp) const;         // inverse, -1 if cp is not a byte-level char
};
const ByteLevelTable& byte_level();

// Maps raw bytes to their byte-level string (e.g. " a" -> "Ġa").
std::string to_byte_level(std::string_view raw);
// Inverse; false (and `out` unspecified) when a code point is not in the table.
bool from_byte_level(std::string_view s, std::string& out);

}  // namespace cm::utf8
