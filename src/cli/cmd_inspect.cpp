// `clawmine inspect DIR [--json] [--derive-input-scale]`
// Prints what a checkpoint holds (config summary, module groups x stored
// format x parameters x bytes, NVFP4 coverage, total size) and the loader's
// validation report with every problem listed; exits 1 when there is one.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "model/inspect.h"

namespace {

struct Opts {
  std::string dir;
  bool json = false;
  bool derive_input_scale = false;
};

int run(const Opts& o) {
  cm::LinearLoadOptions lo;
  lo.allow_missing_input_scale = o.derive_input_scale;
  nlohmann::json r = cm::inspect_checkpoint(o.dir, lo);
  std::string out = o.json ? r.dump(1) + "\n" : cm::inspect_text(r);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return r["problems"].empty() ? 0 : 1;
}

cm::cli::CommandRegistrar reg({"inspect", "Summarise a checkpoint (formats, sizes, NVFP4 coverage) and validate it",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 app.add_option("dir", o->dir, "Checkpoint directory")->required();
                                 app.add_flag("--json", o->json, "Print the report as JSON");
                                 app.add_flag("--derive-input-scale", o->derive_input_scale,
                                              "Validate as loading with --derive-input-scale would");
                                 return [o] { return run(*o); };
                               }});

}  // namespace
