// Parser for generated assistant text (spec §11): splits reasoning (before </think> in thinking
// mode) from content, and extracts DSML tool calls
//   <｜DSML｜ calls> <｜DSML｜ invoke name="N"> <｜DSML｜ parameter name="P"
//   string="true|false">V</｜DSML｜ parameter>
// with typed parameters (string="false" values are JSON). Incremental: the server feeds decoded
// text deltas and streams reasoning/content deltas as soon as they cannot be the start of a marker;
// tool calls are emitted when their invoke closes. Truncation-tolerant: text cut inside reasoning
// stays reasoning, a cut inside the calls block drops only the unfinished call (and says so); a
// malformed call is returned as content, never lost.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/json_ordered.h"

namespace dsv41 {

struct DsmlToolCall {
  std::string name;
  OJson arguments = OJson::object();  // ordered as generated
  // OpenAI `function.arguments`: Python-style JSON of `arguments` (what vLLM returns).
  std::string arguments_json() const { return python_json_dumps(arguments); }
};

struct AssistantEvent {
  enum class Kind { kReasoning, kContent, kToolCall };
  Kind kind;
  std::string text;   // reasoning/content delta
  DsmlToolCall call;  // kToolCall
};

class AssistantStreamParser {
 public:
  // `thinking`: the prompt ended with <think>, so generation starts inside the reasoning.
  // `tool_calls`: extract DSML calls (false: everything after the reasoning is content, e.g. when
  // the request declared no tools or tool_choice is "none").
  explicit AssistantStreamParser(bool thinking, bool tool_calls = true);

  void feed(std::string_view text, std::vector<AssistantEvent>& out);
  // End of generation: flushes held-back text.
  void finish(std::vector<AssistantEvent>& out);

  bool reasoning_unterminated() const { return reasoning_unterminated_; }  // set by finish()
  bool calls_truncated() const { return calls_truncated_; }                // set by finish()
  int malformed_calls() const { return malformed_calls_; }
  // Calls blocks that began inside the reasoning (no </think> before them) and held a call (or
  // closed empty): taken as calls.
  int unclosed_reasoning_calls() const { return unclosed_reasoning_calls_; }

 private:
  enum class State { kReasoning, kContent, kCalls };
  void step(std::vector<AssistantEvent>& out);
  bool step_calls(std::vector<AssistantEvent>& out);  // false: needs more text
  void emit(AssistantEvent::Kind kind, std::string text, std::vector<AssistantEvent>& out);

  State state_;
  bool tool_calls_;
  std::string buf_;
  bool reasoning_unterminated_ = false;
  bool calls_truncated_ = false;
  int malformed_calls_ = 0;
  int unclosed_reasoning_calls_ = 0;
  // A calls tag met inside the reasoning, with the blank line before it: held until the block
  // shows a real invoke (then it is a calls block) or not (then it all was reasoning text).
  std::string reasoning_calls_tag_;
  bool from_reasoning_ = false;  // the current calls block began in the reasoning
  bool drop_think_end_ = false;  // after such a block: a late </think> is dropped, not content
};

struct ParsedAssistant {
  std::string reasoning;
  std::string content;
  std::vector<DsmlToolCall> tool_calls;
  bool reasoning_unterminated = false;
  bool calls_truncated = false;
  int malformed_calls = 0;
};

// One-shot parse of a whole generation (the stream parser fed at once).
ParsedAssistant parse_assistant_text(std::string_view text, bool thinking, bool tool_calls = true);

}  // namespace dsv41
