// dsv41 entry point: subcommand dispatch (design.md §4) and --version.
#include <cstdio>

#include "cli/commands.h"
#include "core/log.h"
#include "ops/kernels.h"
#include "parallel/world.h"

#ifndef DSV41_VERSION
#define DSV41_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  CLI::App app{"dsv41: DeepSeek-V4.1-Flash inference engine and OpenAI-compatible server (CPU)",
               "dsv41"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "Print the version and exit");
  dsv41::cli::Runner run;
  dsv41::cli::add_make_tiny(app, &run);
  dsv41::cli::add_inspect(app, &run);
  dsv41::cli::add_logits(app, &run);
  dsv41::cli::add_explain(app, &run);
  dsv41::cli::add_tokenize(app, &run);
  dsv41::cli::add_detokenize(app, &run);
  dsv41::cli::add_derive_tokenizer(app, &run);
  dsv41::cli::add_bench(app, &run);
  dsv41::cli::add_generate(app, &run);
  dsv41::cli::add_serve(app, &run);
  dsv41::cli::add_run_batch(app, &run);
  dsv41::cli::add_image_embed(app, &run);
  dsv41::cli::add_convert(app, &run);
  dsv41::cli::add_validate(app, &run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : dsv41::cli::kExitUsage;
  }
  if (version) {
    std::printf("dsv41 %s (kernels: %s)\n", DSV41_VERSION,
                dsv41::ops::isa_name(dsv41::ops::active_isa()));
    return 0;
  }
  if (!run) {
    std::fputs(app.help().c_str(), stdout);
    return dsv41::cli::kExitUsage;
  }
  const int code = run();
  // Under mpirun: rank 0 ends the job cleanly, unless a rank failed (MPI cannot finalise without
  // it; exit_now aborts the job with a non-zero code).
  if (dsv41::parallel::World::get().failed())
    dsv41::parallel::World::exit_now(code != 0 ? code : 3);
  dsv41::parallel::World::finalize();
  return code;
}
