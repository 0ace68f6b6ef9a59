// Parser for generated assistant text (spec §11): splits reasoning (before </think> in thinking
// mode) from content, and extracts DSML tool calls
//   <｜DSML｜ calls> <｜DSML｜ invoke name="N"> <｜DSML｜ parameter name="P"
//   string="true|false">V</｜DSML｜ parameter>
// with typed parameters (string="false" values are JSON). Incremental: the server feeds decoded
// text deltas and streams reasoning/content deltas as soon as they cannot be the start of a marker;
// a tool call streams too: its name when the invoke's header is complete, then its arguments' JSON
// text piece by piece as the parameters are generated (the pieces concatenate to the call's
// `arguments_json()` byte for byte). Truncation-tolerant: text cut inside reasoning stays
// reasoning, a cut inside the calls block drops only the unfinished call (and says so); a
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
  // The arguments' JSON text as the parser streamed it: Python-style JSON of `arguments` (what
  // vLLM returns), except that a repeated parameter appears twice (JSON parsers keep the last, as
  // `arguments` does). Empty for a call not built by the parser.
  std::string arguments_text;
  // OpenAI `function.arguments`.
  std::string arguments_json() const {
    return arguments_text.empty() ? python_json_dumps(arguments) : arguments_text;
  }
};

// Events of the stream, in generation order. A tool call is kToolCallBegin (call.name), then
// kToolCallDelta pieces of its arguments' JSON text, then either kToolCall (the complete call, its
// arguments_text the concatenated deltas) or kToolCallAbort: the invoke turned out malformed or was
// cut; what the whole-text parse makes of it (content, reasoning, or nothing) follows. Whole-text
// consumers read only kReasoning, kContent and kToolCall.
struct AssistantEvent {
  enum class Kind {
    kReasoning,
    kContent,
    kToolCall,
    kToolCallBegin,
    kToolCallDelta,
    kToolCallAbort
  };
  Kind kind;
  std::string text;   // reasoning/content delta; kToolCallDelta: a piece of the arguments' JSON
  DsmlToolCall call;  // kToolCall; kToolCallBegin: the name
};

// Scans one invoke `<｜DSML｜ invoke name="N">` params `</｜DSML｜ invoke>` as its text grows,
// deciding as it goes the arguments' JSON text: a parameter's `"key": ` when its tag is complete,
// a string value's escaped bytes as they arrive (holding back only what may begin the closing tag
// or is an unfinished UTF-8 character), a string="false" value when it closes (it is re-serialised
// from its parse, or kept as a string if it is no JSON).
class InvokeScanner {
 public:
  enum class State { kHeader, kBetween, kParamHeader, kString, kRaw, kDone, kBroken };
  // `s`: the invoke's text from its open tag, the same bytes as last time plus more. Appends the
  // newly decided JSON text to `delta`.
  void scan(std::string_view s, std::string& delta);
  State state() const { return state_; }
  bool named() const { return state_ != State::kHeader && state_ != State::kBroken; }
  std::size_t end() const { return pos_; }  // kDone: the offset after the invoke's closing tag
  DsmlToolCall& call() { return call_; }

 private:
  State state_ = State::kHeader;
  std::size_t pos_ = 0;    // scanned up to here
  std::size_t value_ = 0;  // kRaw: where the value starts
  std::string key_, string_value_;
  int params_ = 0;
  DsmlToolCall call_;
};

class AssistantStreamParser {
 public:
  // `thinking`: the prompt ended with <think>, so generation starts inside the reasoning.
  // `tool_calls`: extract DSML calls (false: everything after the reasoning is content, e.g. when
  // the request declared no tools or tool_choice is "none").
  explicit AssistantStreamParser(bool thinking, bool tool_calls = true);
  // parallel_tool_calls false: the events of calls after the first complete one are dropped.
  void set_single_call(bool on) { single_call_ = on; }

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
  // The open invoke (rest: from its tag) could not be streamed as a call: say so if it began.
  void abort_call(std::vector<AssistantEvent>& out);

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
  // The invoke being generated; `begun_`: its kToolCallBegin went out.
  InvokeScanner scanner_;
  bool begun_ = false;
  bool single_call_ = false;
  int calls_ = 0;  // complete calls emitted
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
