// libFuzzer target: the assistant stream parser (reasoning / content / DSML tool calls) fed the
// input in chunkings drawn from its first bytes; every chunking must give exactly what the one-shot
// parse gives (the server streams whatever chunks the detokenizer produces).
#include "fuzz_util.h"
#include "text/dsml_parser.h"

namespace {

struct Result {
  std::string reasoning, content, calls;
  bool operator==(const Result&) const = default;
};

Result run(std::string_view text, bool thinking, bool tools, uint32_t seed) {
  dsv41::AssistantStreamParser p(thinking, tools);
  std::vector<dsv41::AssistantEvent> events;
  Result r;
  auto take = [&] {
    for (auto& e : events) {
      if (e.kind == dsv41::AssistantEvent::Kind::kReasoning) r.reasoning += e.text;
      if (e.kind == dsv41::AssistantEvent::Kind::kContent) r.content += e.text;
      if (e.kind == dsv41::AssistantEvent::Kind::kToolCall)
        r.calls += e.call.name + "(" + e.call.arguments_json() + ");";
    }
    events.clear();
  };
  for (std::size_t at = 0; at < text.size();) {
    std::size_t n = seed == 0 ? text.size() : 1 + (seed >> 3) % 9;
    seed = seed * 1103515245u + 12345u;
    p.feed(text.substr(at, n), events);
    take();
    at += n;
  }
  p.finish(events);
  take();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const bool thinking = data[0] & 1, tools = data[0] & 2;
  const uint32_t seed = uint32_t(data[1]) * 2654435761u + 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const Result whole = run(text, thinking, tools, 0);
  if (!(run(text, thinking, tools, seed) == whole))
    dsv41::fuzz::invariant_failed("a chunking changed what the parser returns");
  return 0;
}
