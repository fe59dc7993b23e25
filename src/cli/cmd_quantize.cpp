// `clawmine quantize --in DIR --out DIR [--calib FILE] [--include GLOB ...] [--exclude GLOB ...]`
// Writes a sharded ModelOpt-format NVFP4 checkpoint from an F32, BF16,
// FP8-block or MXFP4 one (src/quant/quantize.h). With --calib (token ids, one
// sequence per line, or text for the source's tokenizer) the model runs on the CPU first and every input_scale
// comes from the observed activation amax; without it the documented default
// is used and reported. Progress and the summary go to stderr.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "common/error.h"
#include "runtime/calibrate.h"
#include "quant/quantize.h"

namespace {

struct Opts {
  cm::QuantizeOptions q;
  std::string calib;
  std::string calib_format = "auto";
  int64_t calib_seq_len = 512;
  double shard_mb = 2048;
};

int run(Opts& o) {
  CM_CHECK(o.shard_mb > 0, "--shard-size-mb must be > 0 (got {})", o.shard_mb);
  o.q.shard_bytes = int64_t(o.shard_mb * 1024 * 1024);
  std::map<std::string, float> amax;
  if (!o.calib.empty()) {
    cm::CalibFormat f = o.calib_format == "ids" ? cm::CalibFormat::IDS
                        : o.calib_format == "text" ? cm::CalibFormat::TEXT
                                                   : cm::CalibFormat::AUTO;
    auto seqs = cm::read_calibration(o.calib, o.q.in_dir, f);
    amax = cm::calibrate_input_amax(o.q.in_dir, seqs, o.calib_seq_len, stderr);
  }
  cm::QuantizeSummary s = cm::quantize_checkpoint(o.q, amax, stderr);
  std::fprintf(stderr,
               "quantize: %lld linears -> NVFP4 (%.3f M weights), %lld tensors kept as stored, %lld shard(s); "
               "input_scale: %lld calibrated, %lld default; %.2f MB -> %.2f MB\n",
               (long long)s.quantized, double(s.nvfp4_params) / 1e6, (long long)s.kept, (long long)s.shards,
               (long long)s.calibrated, (long long)s.defaulted, double(s.bytes_in) / 1e6, double(s.bytes_out) / 1e6);
  return 0;
}

cm::cli::CommandRegistrar reg(
    {"quantize", "Write an NVFP4 (ModelOpt format) checkpoint from an F32/BF16/FP8/MXFP4 one",
     [](CLI::App& app) -> cm::cli::CommandRun {
       auto o = std::make_shared<Opts>();
       app.add_option("--in", o->q.in_dir, "Source checkpoint directory")->required();
       app.add_option("--out", o->q.out_dir, "Output directory (must not exist or be empty)")->required();
       app.add_option("--calib", o->calib,
                      "Calibration data: token ids (one sequence per line, separated by spaces or commas) or text "
                      "(tokenized with the source's tokenizer.json)");
       app.add_option("--calib-format", o->calib_format, "auto (ids if every item is an integer), ids or text")
           ->check(CLI::IsMember({"auto", "ids", "text"}));
       app.add_option("--calib-seq-len", o->calib_seq_len, "Cut calibration sequences into pieces of N tokens");
       app.add_option("--include", o->q.include,
                      "Also quantize modules matching GLOB ('*' any run, '?' one char; e.g. '*.indexer.wq_b')");
       app.add_option("--exclude", o->q.exclude, "Keep modules matching GLOB as stored (wins over --include)");
       app.add_option("--default-input-amax", o->q.default_input_amax,
                      "Activation amax assumed where calibration gives none (default 2688: input_scale 1.0)");
       app.add_option("--shard-size-mb", o->shard_mb, "Target size of one output shard in MiB (default 2048)");
       return [o] { return run(*o); };
     }});

}  // namespace
