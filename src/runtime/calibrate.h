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

enum class CalibFormat { AUTO, IDS, TEXT };

// Reads a calibration file. IDS: one sequence per non-empty line, token ids
// separated by spaces or commas. TEXT: the file's bytes, tokenized with the
// tokenizer of model_dir (tokenizer.json) into one sequence. AUTO: IDS when
// every item of the file is a non-negative integer, TEXT otherwise.
std::vector<std::vector<int32_t>> read_calibration(const std::string& path, const std::string& model_dir,
                                                   CalibFormat format = CalibFormat::AUTO);

// Loads the model at dir, feeds each sequence (cut into pieces of at most
// max_len tokens, each from a fresh state) and returns amax of the input of
// every linear that was called, keyed by its checkpoint module name.
std::map<std::string, float> calibrate_input_amax(const std::string& dir,
                                                  const std::vector<std::vector<int32_t>>& seqs, int64_t max_len,
                                                  std::FILE* log);

}  // namespace cm
