// Incremental reasoning/content/DSML split of generated text. Held back at any moment: only the
// longest suffix of the buffer that could still begin a marker, so deltas flow with at most a
// marker's length of delay.
#include "text/dsml_parser.h"

#include <algorithm>
#include <optional>

#include "text/special_tokens.h"

namespace dsv41 {
namespace {

const std::string kCallsOpen = std::string("<") + tokens::kDsml + " calls>";
const std::string kCallsOpenAfterBlank = "\n\n" + kCallsOpen;
const std::string kCallsClose = std::string("</") + tokens::kDsml + " calls>";
const std::string kInvokeOpen = std::string("<") + tokens::kDsml + " invoke name=\"";
const std::string kInvokeClose = std::string("</") + tokens::kDsml + " invoke>";
const std::string kParamOpen = std::string("<") + tokens::kDsml + " parameter name=\"";
const std::string kParamClose = std::string("</") + tokens::kDsml + " parameter>";

// Length of the longest proper prefix of `marker` that `buf` ends with.
std::size_t partial_suffix(std::string_view buf, std::string_view marker) {
  std::size_t max = std::min(buf.size(), marker.size() - 1);
  for (std::size_t k = max; k > 0; --k)
    if (buf.substr(buf.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::size_t skip_space(std::string_view s, std::size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

bool starts_with(std::string_view s, std::size_t at, std::string_view prefix) {
  return s.size() - at >= prefix.size() && s.substr(at, prefix.size()) == prefix;
}

// Parses one complete invoke: `<｜DSML｜ invoke name="N">` params `</｜DSML｜ invoke>`.
std::optional<DsmlToolCall> parse_invoke(std::string_view s) {
  if (!starts_with(s, 0, kInvokeOpen)) return std::nullopt;
  std::size_t i = kInvokeOpen.size();
  std::size_t q = s.find("\">", i);
  if (q == std::string_view::npos) return std::nullopt;
  DsmlToolCall call;
  call.name = std::string(s.substr(i, q - i));
  if (call.name.empty()) return std::nullopt;
  i = q + 2;
  for (;;) {
    i = skip_space(s, i);
    if (starts_with(s, i, kInvokeClose))
      return skip_space(s, i + kInvokeClose.size()) == s.size()
                 ? std::optional<DsmlToolCall>(std::move(call))
                 : std::nullopt;
    if (!starts_with(s, i, kParamOpen)) return std::nullopt;
    i += kParamOpen.size();
    std::size_t name_end = s.find('"', i);
    if (name_end == std::string_view::npos) return std::nullopt;
    std::string key(s.substr(i, name_end - i));
    i = name_end + 1;
    bool is_string = true;
    if (starts_with(s, i, " string=\"true\">")) {
      i += 15;
    } else if (starts_with(s, i, " string=\"false\">")) {
      is_string = false;
      i += 16;
    } else if (starts_with(s, i, ">")) {
      i += 1;
    } else {
      return std::nullopt;
    }
    std::size_t end = s.find(kParamClose, i);
    if (end == std::string_view::npos) return std::nullopt;
    std::string_view raw = s.substr(i, end - i);
    OJson value = std::string(raw);
    if (!is_string) {
      // A value that is not valid JSON is kept as text rather than dropped.
      if (auto parsed = parse_json_ordered(raw)) value = std::move(*parsed);
    }
    call.arguments[key] = std::move(value);
    i = end + kParamClose.size();
  }
}

}  // namespace

AssistantStreamParser::AssistantStreamParser(bool thinking, bool tool_calls)
    : state_(thinking ? State::kReasoning : State::kContent), tool_calls_(tool_calls) {}

void AssistantStreamParser::emit(AssistantEvent::Kind kind, std::string text,
                                 std::vector<AssistantEvent>& out) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != AssistantEvent::Kind::kToolCall) {
    out.back().text += text;
    return;
  }
  AssistantEvent e{kind, std::move(text), {}};
  out.push_back(std::move(e));
}

void AssistantStreamParser::feed(std::string_view text, std::vector<AssistantEvent>& out) {
  buf_.append(text);
  step(out);
}

void AssistantStreamParser::step(std::vector<AssistantEvent>& out) {
  for (;;) {
    if (state_ == State::kReasoning) {
      std::size_t pos = buf_.find(tokens::kThinkEnd);
      // A calls block before any </think> ends the reasoning too: the model skipped the marker
      // (seen at high effort; the call would otherwise be lost inside the reasoning).
      const std::size_t calls = tool_calls_ ? buf_.find(kCallsOpen) : std::string::npos;
      if (calls != std::string::npos && (pos == std::string::npos || calls < pos)) {
        std::string reasoning = buf_.substr(0, calls);
        reasoning_calls_tag_ = kCallsOpen;
        if (reasoning.size() >= 2 && reasoning.compare(reasoning.size() - 2, 2, "\n\n") == 0) {
          reasoning.resize(reasoning.size() - 2);
          reasoning_calls_tag_ = "\n\n" + kCallsOpen;
        }
        emit(AssistantEvent::Kind::kReasoning, std::move(reasoning), out);
        buf_.erase(0, calls + kCallsOpen.size());
        state_ = State::kCalls;
        continue;
      }
      if (pos != std::string::npos) {
        emit(AssistantEvent::Kind::kReasoning, buf_.substr(0, pos), out);
        buf_.erase(0, pos + std::string_view(tokens::kThinkEnd).size());
        state_ = State::kContent;
        continue;
      }
      std::size_t hold = partial_suffix(buf_, tokens::kThinkEnd);
      if (tool_calls_)
        hold = std::max(
            {hold, partial_suffix(buf_, kCallsOpenAfterBlank), partial_suffix(buf_, kCallsOpen)});
      emit(AssistantEvent::Kind::kReasoning, buf_.substr(0, buf_.size() - hold), out);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
    if (state_ == State::kContent && drop_think_end_) {
      // After a calls block that began in the reasoning, the model's late </think> is not content.
      const std::size_t i = skip_space(buf_, 0);
      const std::string_view rest = std::string_view(buf_).substr(i);
      const std::string_view end = tokens::kThinkEnd;
      if (rest.size() < end.size() && end.substr(0, rest.size()) == rest) return;  // wait
      if (rest.substr(0, end.size()) == end) buf_.erase(0, i + end.size());
      drop_think_end_ = false;
      continue;
    }
    if (state_ == State::kContent && !tool_calls_) {
      emit(AssistantEvent::Kind::kContent, std::move(buf_), out);
      buf_.clear();
      return;
    }
    if (state_ == State::kContent) {
      std::size_t pos = buf_.find(kCallsOpen);
      if (pos != std::string::npos) {
        std::string content = buf_.substr(0, pos);
        // The encoder separates content and calls by one blank line.
        if (content.size() >= 2 && content.compare(content.size() - 2, 2, "\n\n") == 0)
          content.resize(content.size() - 2);
        emit(AssistantEvent::Kind::kContent, std::move(content), out);
        buf_.erase(0, pos + kCallsOpen.size());
        state_ = State::kCalls;
        continue;
      }
      std::size_t hold =
          std::max(partial_suffix(buf_, kCallsOpenAfterBlank), partial_suffix(buf_, kCallsOpen));
      emit(AssistantEvent::Kind::kContent, buf_.substr(0, buf_.size() - hold), out);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
    if (!step_calls(out)) return;
  }
}

// Inside a calls block: consumes complete invokes and the closing tag. Returns false when it needs
// more text; true when the state changed (or progress was made) and the loop should continue.
bool AssistantStreamParser::step_calls(std::vector<AssistantEvent>& out) {
  std::size_t i = skip_space(buf_, 0);
  std::string_view rest = std::string_view(buf_).substr(i);
  if (rest.empty()) return false;
  if (starts_with(rest, 0, kCallsClose)) {
    buf_.erase(0, i + kCallsClose.size());
    state_ = State::kContent;             // text after the block (normally none) is content again
    if (!reasoning_calls_tag_.empty()) {  // an empty block that began in the reasoning
      ++unclosed_reasoning_calls_;
      reasoning_calls_tag_.clear();
      drop_think_end_ = true;
    } else if (from_reasoning_) {
      drop_think_end_ = true;
    }
    from_reasoning_ = false;
    return true;
  }
  if (starts_with(rest, 0, kInvokeOpen)) {
    std::size_t end = rest.find(kInvokeClose);
    if (end == std::string_view::npos) return false;
    std::string_view invoke = rest.substr(0, end + kInvokeClose.size());
    if (auto call = parse_invoke(invoke)) {
      if (!reasoning_calls_tag_.empty()) {  // a real call: the block that began in the reasoning
        ++unclosed_reasoning_calls_;        // is taken as calls from here on
        reasoning_calls_tag_.clear();
        from_reasoning_ = true;
      }
      AssistantEvent e{AssistantEvent::Kind::kToolCall, {}, std::move(*call)};
      out.push_back(std::move(e));
    } else if (!reasoning_calls_tag_.empty()) {
      // The tag in the reasoning opened no call (the model wrote about it): all of it was
      // reasoning, and the reasoning goes on.
      emit(AssistantEvent::Kind::kReasoning,
           reasoning_calls_tag_ + buf_.substr(0, i + invoke.size()), out);
      buf_.erase(0, i + invoke.size());
      reasoning_calls_tag_.clear();
      state_ = State::kReasoning;
      return true;
    } else {
      ++malformed_calls_;
      emit(AssistantEvent::Kind::kContent, std::string(invoke), out);
    }
    buf_.erase(0, i + invoke.size());
    return true;
  }
  // Could still become one of the two tags: wait.
  auto could_become = [&](const std::string& tag) {
    return rest.size() < tag.size() && tag.compare(0, rest.size(), rest) == 0;
  };
  if (could_become(kCallsClose) || could_become(kInvokeOpen)) return false;
  if (!reasoning_calls_tag_.empty()) {  // the tag in the reasoning opened no block: reasoning
    emit(AssistantEvent::Kind::kReasoning, reasoning_calls_tag_, out);
    reasoning_calls_tag_.clear();
    state_ = State::kReasoning;
    return true;
  }
  // Anything else inside the block is malformed: the text from here is content again (a later
  // calls tag in it opens a block, whatever the chunking that brought it).
  ++malformed_calls_;
  state_ = State::kContent;
  return true;
}

void AssistantStreamParser::finish(std::vector<AssistantEvent>& out) {
  switch (state_) {
    case State::kReasoning:
      reasoning_unterminated_ = true;
      emit(AssistantEvent::Kind::kReasoning, std::move(buf_), out);
      break;
    case State::kContent:
      emit(AssistantEvent::Kind::kContent, std::move(buf_), out);
      break;
    case State::kCalls:
      if (!reasoning_calls_tag_.empty()) {  // a tag in unterminated reasoning, no call after it
        reasoning_unterminated_ = true;
        emit(AssistantEvent::Kind::kReasoning, reasoning_calls_tag_ + buf_, out);
        break;
      }
      // Cut inside the block: an unfinished call is not returned (its arguments are incomplete).
      calls_truncated_ = true;
      break;
  }
  buf_.clear();
}

ParsedAssistant parse_assistant_text(std::string_view text, bool thinking, bool tool_calls) {
  AssistantStreamParser parser(thinking, tool_calls);
  std::vector<AssistantEvent> events;
  parser.feed(text, events);
  parser.finish(events);
  ParsedAssistant r;
  for (auto& e : events) {
    switch (e.kind) {
      case AssistantEvent::Kind::kReasoning:
        r.reasoning += e.text;
        break;
      case AssistantEvent::Kind::kContent:
        r.content += e.text;
        break;
      case AssistantEvent::Kind::kToolCall:
        r.tool_calls.push_back(std::move(e.call));
        break;
    }
  }
  r.reasoning_unterminated = parser.reasoning_unterminated();
  r.calls_truncated = parser.calls_truncated();
  r.malformed_calls = parser.malformed_calls();
  return r;
}

}  // namespace dsv41
