// libFuzzer target: the assistant stream parser (reasoning / content / DSML tool calls) fed the
// input in chunkings drawn from its first bytes; every chunking must give exactly what the one-shot
// parse gives, the order of reasoning, content and calls included (the server streams whatever
// chunks the detokenizer produces, and the Messages and Responses writers make blocks of the runs),
// and a call's streamed argument pieces must concatenate to its arguments exactly.
#include "fuzz_util.h"
#include "text/dsml_parser.h"

namespace {

// What the parser returned, in order: runs of one kind (reasoning 'r', content 'c') with adjacent
// text of the same kind merged, and each tool call ('t') on its own, so a chunking that moved text
// across a block boundary or reordered reasoning, content and calls changes it.
struct Result {
  std::vector<std::pair<char, std::string>> runs;
  bool operator==(const Result&) const = default;
  void add(char kind, const std::string& text) {
    if (kind != 't' && text.empty()) return;
    if (kind != 't' && !runs.empty() && runs.back().first == kind)
      runs.back().second += text;
    else
      runs.emplace_back(kind, text);
  }
};

Result run(std::string_view text, bool thinking, bool tools, uint32_t seed) {
  dsv41::AssistantStreamParser p(thinking, tools);
  std::vector<dsv41::AssistantEvent> events;
  Result r;
  std::string streamed;  // the open call's argument pieces
  auto take = [&] {
    using Kind = dsv41::AssistantEvent::Kind;
    for (auto& e : events) {
      if (e.kind == Kind::kReasoning) r.add('r', e.text);
      if (e.kind == Kind::kContent) r.add('c', e.text);
      if (e.kind == Kind::kToolCallBegin) streamed.clear();
      if (e.kind == Kind::kToolCallDelta) streamed += e.text;
      if (e.kind == Kind::kToolCall) {
        if (streamed != e.call.arguments_json())
          dsv41::fuzz::invariant_failed("streamed arguments differ from the call's");
        r.add('t', e.call.name + "(" + e.call.arguments_json() + ")");
      }
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
