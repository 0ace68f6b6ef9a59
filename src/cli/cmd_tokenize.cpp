// `dsv41 tokenize`, `dsv41 detokenize` (design.md §4) and `dsv41 derive-tokenizer` (a V4.1-style
// tokenizer.json from DeepSeek-V3's, text/v41_tokenizer.h).
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/messages_file.h"
#include "cli/token_args.h"
#include "core/log.h"
#include "io/text_file.h"
#include "text/tokenizer.h"
#include "text/tokenizer_file.h"
#include "text/v41_tokenizer.h"

namespace dsv41::cli {
namespace {
namespace fs = std::filesystem;
}  // namespace

void add_tokenize(CLI::App& app, Runner* run) {
  struct Args {
    std::string model, text, messages;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "Text (no BOS added) or chat messages (V4.1 chat encoding) to token ids.");
  sub->add_option("--model", a->model, "Checkpoint directory holding tokenizer.json")->required();
  auto* text = sub->add_option("--text", a->text, "Text to encode");
  auto* msgs = sub->add_option(
      "--messages", a->messages,
      "Chat request JSON ({\"messages\", \"tools\", \"chat_template_kwargs\"}) to "
      "encode with the V4.1 chat format (BOS included); --json adds the prompt text");
  text->excludes(msgs);
  sub->add_flag("--json", a->json, "Print {\"ids\": [...]}");
  sub->callback([a, run, text, msgs] {
    *run = [a, text, msgs] {
      if (!text->count() && !msgs->count()) {
        log::error("tokenize: one of --text or --messages is required");
        return kExitUsage;
      }
      auto tok = model_tokenizer(a->model);
      if (!tok) {
        log::error("tokenize: {}", tok.status().message());
        return kExitInvalid;
      }
      std::string input = a->text;
      if (msgs->count()) {
        auto file = read_messages_file(a->messages);
        if (!file) {
          log::error("tokenize: --messages: {}", file.status().message());
          return kExitInvalid;
        }
        input = std::move(file->prompt);
      }
      const auto ids = (*tok)->encode(input);
      if (a->json) {
        nlohmann::json out{{"ids", ids}};
        if (msgs->count()) out["text"] = input;
        std::printf("%s\n", out.dump().c_str());
      } else {
        std::string s;
        for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
        std::printf("%s\n", s.c_str());
      }
      return kExitOk;
    };
  });
}

void add_detokenize(CLI::App& app, Runner* run) {
  struct Args {
    std::string model, ids;
    bool skip_special = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub =
      app.add_subcommand("detokenize", "Token ids to text (UTF-8; U+FFFD for ill-formed bytes).");
  sub->add_option("--model", a->model, "Checkpoint directory holding tokenizer.json")->required();
  sub->add_option("--ids", a->ids, "Token ids, comma separated")->required();
  sub->add_flag("--skip-special", a->skip_special, "Drop special tokens");
  sub->callback([a, run] {
    *run = [a] {
      auto ids = parse_tokens(a->ids, "--ids");
      if (!ids) {
        log::error("detokenize: {}", ids.status().message());
        return kExitUsage;
      }
      auto tok = model_tokenizer(a->model);
      if (!tok) {
        log::error("detokenize: {}", tok.status().message());
        return kExitInvalid;
      }
      auto text = (*tok)->decode(ids.value(), a->skip_special);
      if (!text) {
        log::error("detokenize: --ids: {}", text.status().message());
        return kExitInvalid;
      }
      std::fwrite(text->data(), 1, text->size(), stdout);
      std::fputc('\n', stdout);
      return kExitOk;
    };
  });
}

void add_derive_tokenizer(CLI::App& app, Runner* run) {
  struct Args {
    std::string from, out;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("derive-tokenizer",
                                     "Write a V4.1-style tokenizer.json + tokenizer_config.json "
                                     "derived from DeepSeek-V3's tokenizer.json "
                                     "(same base BPE, V4.1 added-token table; docs/tokenizer.md).");
  sub->add_option("--from", a->from, "DeepSeek-V3 tokenizer.json")->required();
  sub->add_option("--out", a->out, "Output directory")->required();
  sub->callback([a, run] {
    *run = [a] {
      auto v3 = read_text_file(a->from);
      if (!v3) {
        log::error("derive-tokenizer: --from: {}", v3.status().message());
        return kExitInvalid;
      }
      auto v41 = derive_v41_tokenizer_json(v3.value(), a->from);
      if (!v41) {
        log::error("derive-tokenizer: {}", v41.status().message());
        return kExitInvalid;
      }
      std::error_code ec;
      fs::create_directories(a->out, ec);
      Status st = write_text_file((fs::path(a->out) / "tokenizer.json").string(), v41.value());
      if (st.is_ok())
        st = write_text_file((fs::path(a->out) / "tokenizer_config.json").string(),
                             make_tiny_tokenizer().tokenizer_config_json);
      if (!st.is_ok()) {
        log::error("derive-tokenizer: --out: {}", st.message());
        return kExitInvalid;
      }
      std::printf("%s\n", nlohmann::json{{"out", a->out}, {"vocab", kV41VocabSize}}.dump().c_str());
      return kExitOk;
    };
  });
}

}  // namespace dsv41::cli
