// `dsv41 generate`: one prompt in, streamed text out, with load progress and tokens/s at the end.
// Runs through the same engine API as the server.
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/fast_model_dir.h"
#include "core/log.h"
#include "engine/engine.h"
#include "parallel/world.h"
#include "text/chat.h"

namespace dsv41::cli {

void add_generate(CLI::App& app, Runner* run) {
  struct Args {
    std::string model, prompt;
    int max_tokens = 64;
    double temperature = 0.0;
    uint64_t seed = 0;
    bool chat = false, thinking = false, ignore_eos = false;
    PathArgs paths;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub =
      app.add_subcommand("generate", "Generate from one prompt, streaming the text to stdout.");
  sub->add_option("--model", a->model, "Checkpoint directory (default: the demo model of `serve`)");
  sub->add_option("--prompt", a->prompt, "Prompt text (raw, no BOS; with --chat: one user message)")
      ->required();
  sub->add_option("--max-tokens", a->max_tokens, "Most tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  sub->add_option("--temperature", a->temperature, "0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  sub->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  sub->add_flag("--chat", a->chat,
                "Wrap the prompt in the V4.1 chat format (one user turn, chat mode)");
  sub->add_flag("--thinking", a->thinking,
                "With --chat: thinking mode (the reasoning is printed too)");
  // The server's `ignore_eos`: benchmarks and checks that need a fixed length get exactly
  // --max-tokens tokens whatever the model says.
  sub->add_flag("--ignore-eos", a->ignore_eos,
                "Keep generating past the end-of-sentence token: exactly --max-tokens tokens");
  add_path_options(sub, &a->paths);
  sub->callback([a, run] {
    *run = [a] {
      std::string dir = a->model;
      if (dir.empty()) {
        auto d = parallel::World::get().rank0_first(ensure_demo_model);
        if (!d) {
          log::error("generate: demo model: {}", d.status().message());
          return kExitInvalid;
        }
        dir = *d;
      }
      log::info("generate: loading {} ...", dir);
      const auto t0 = std::chrono::steady_clock::now();
      EngineOptions eo;
      if (Status st = apply_path_options(a->paths, dir, &eo); !st.is_ok()) {
        log::error("generate: {}", model_error(st));
        return kExitInvalid;
      }
      auto engine = Engine::load(eo);
      if (!engine) {
        log::error("generate: {}", model_error(engine.status()));
        return kExitInvalid;
      }
      const auto t1 = std::chrono::steady_clock::now();
      log::info("generate: loaded in {:.1f} s", std::chrono::duration<double>(t1 - t0).count());
      std::string text = a->prompt;
      if (a->chat) {
        std::vector<ChatMessage> msgs(1);
        msgs[0].role = "user";
        msgs[0].content = a->prompt;
        ChatOptions co;
        co.thinking = a->thinking;
        auto p = encode_chat(msgs, co);
        if (!p) {
          log::error("generate: --prompt: {}", p.status().message());
          return kExitUsage;
        }
        text = *p;
      }
      GenerationRequest req;
      req.prompt = (*engine)->tokenizer().encode(text);
      req.sampling.max_tokens = a->max_tokens;
      req.sampling.temperature = a->temperature;
      req.sampling.seed = a->seed;
      req.sampling.ignore_eos = a->ignore_eos;
      auto h = (*engine)->submit(req);
      if (!h) {
        log::error("generate: {}", h.status().message());
        return kExitUsage;
      }
      RequestOutput out;
      std::chrono::steady_clock::time_point first;
      bool got_first = false;
      for (;;) {
        if (!h->next(out, std::chrono::milliseconds(200))) continue;
        if (!got_first && !out.tokens.empty()) {
          got_first = true;
          first = std::chrono::steady_clock::now();
        }
        std::fwrite(out.text.data(), 1, out.text.size(), stdout);
        std::fflush(stdout);
        if (out.finished) break;
      }
      // The text ends its own line, flushed before the statistics go to stderr: piped into one
      // stream (2>&1), the log line must not land in the middle of the text's last line.
      std::fputc('\n', stdout);
      std::fflush(stdout);
      const auto t2 = std::chrono::steady_clock::now();
      if (out.reason == FinishReason::kError) {
        log::error("generate: {}", out.error);
        return kExitInvalid;
      }
      const double gen_s = std::chrono::duration<double>(t2 - t1).count();
      const double decode_s = got_first ? std::chrono::duration<double>(t2 - first).count() : 0;
      log::info(
          "generate: {} prompt tokens, {} generated in {:.2f} s ({:.2f} tokens/s decode, first "
          "token after "
          "{:.2f} s), finish: {}",
          out.prompt_tokens, out.completion_tokens, gen_s,
          out.completion_tokens > 1 && decode_s > 0
              ? static_cast<double>(out.completion_tokens - 1) / decode_s
              : 0.0,
          got_first ? std::chrono::duration<double>(first - t1).count() : 0.0,
          finish_reason_name(out.reason));
      return kExitOk;
    };
  });
}

}  // namespace dsv41::cli
