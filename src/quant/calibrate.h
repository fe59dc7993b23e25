// Activation calibration for the quantizer: runs the CPU model over token
// sequences and records, for every linear, the amax of its fp32 input (the
// quantity an NVFP4 input_scale = amax / (6 * 448) is made from).
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace cm {

// Reads a calibration file of token ids: one sequence per non-empty line,
// ids separated by spaces or commas. Text files are refused with a message
// (tokenization happens elsewhere).
std::vector<std::vector<int32_t>> read_calibration_tokens(const std::string& path);

// Loads the model at dir, feeds each sequence (cut into pieces of at most
// max_len tokens, each from a fresh state) and returns amax of the input of
// every linear that was called, keyed by its checkpoint module name.
std::map<std::string, float> calibrate_input_amax(const std::string& dir,
                                                  const std::vector<std::vector<int32_t>>& seqs, int64_t max_len,
                                                  std::FILE* log);

}  // namespace cm
