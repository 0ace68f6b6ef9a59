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

// Bytes at the end of `s` that begin a UTF-8 character not complete yet (held back so that a
// streamed piece never splits a character).
std::size_t utf8_tail(std::string_view s) {
  for (std::size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > k ? k : 0;
  }
  return 0;
}

// The JSON string escaping of python_json_dumps without the quotes (it is byte-wise, so escaping
// pieces and concatenating them gives the escaping of the whole).
void append_escaped(std::string_view raw, std::string& out) {
  const std::string q = python_json_dumps(OJson(std::string(raw)));
  out.append(q, 1, q.size() - 2);
}

enum class Match { kYes, kMaybe, kNo };

// Does `s` from `at` begin with `tag` (kMaybe: it is a proper prefix of it so far)?
Match match_at(std::string_view s, std::size_t at, std::string_view tag) {
  const std::string_view rest = s.substr(at);
  if (rest.size() >= tag.size())
    return rest.substr(0, tag.size()) == tag ? Match::kYes : Match::kNo;
  return tag.substr(0, rest.size()) == rest ? Match::kMaybe : Match::kNo;
}

// The first invoke closing tag ends the invoke whatever comes before it (as the whole-text parse
// always did), so a part that would reach past it is malformed.
bool before_invoke_close(std::string_view s, std::size_t from, std::size_t at) {
  const std::size_t close = s.find(kInvokeClose, from);
  return close == std::string_view::npos || at < close;
}

}  // namespace

void InvokeScanner::scan(std::string_view s, std::string& delta) {
  auto decided = [&](std::string_view text) {
    delta.append(text);
    call_.arguments_text.append(text);
  };
  for (;;) {
    switch (state_) {
      case State::kHeader: {
        pos_ = std::max(pos_, kInvokeOpen.size());
        const std::size_t q = s.find("\">", pos_);
        if (q == std::string_view::npos) {
          // The invoke closed without a header end: malformed. (Searched from where the last
          // scan ended, less a tag's length: the rest was searched then.)
          const std::size_t from =
              std::max(kInvokeOpen.size(), pos_ - std::min(pos_, kInvokeClose.size()));
          if (s.find(kInvokeClose, from) != std::string_view::npos) state_ = State::kBroken;
          pos_ = std::max(pos_, s.size() - 1);  // a '"' at the end may meet its '>'
          return;
        }
        if (!before_invoke_close(s, kInvokeOpen.size(), q)) {
          state_ = State::kBroken;
          return;
        }
        call_.name = std::string(s.substr(kInvokeOpen.size(), q - kInvokeOpen.size()));
        if (call_.name.empty()) {
          state_ = State::kBroken;
          return;
        }
        pos_ = q + 2;
        state_ = State::kBetween;
        break;
      }
      case State::kBetween: {
        pos_ = skip_space(s, pos_);
        if (pos_ == s.size()) return;
        const Match close = match_at(s, pos_, kInvokeClose);
        if (close == Match::kYes) {
          decided(params_ > 0 ? "}" : "{}");
          pos_ += kInvokeClose.size();
          state_ = State::kDone;
          return;
        }
        const Match param = match_at(s, pos_, kParamOpen);
        if (param == Match::kYes) {
          pos_ += kParamOpen.size();
          state_ = State::kParamHeader;
          break;
        }
        if (close == Match::kNo && param == Match::kNo) state_ = State::kBroken;
        return;
      }
      case State::kParamHeader: {
        const std::size_t name_end = s.find('"', pos_);
        if (name_end == std::string_view::npos) {
          if (s.find(kInvokeClose, pos_) != std::string_view::npos) state_ = State::kBroken;
          return;
        }
        if (!before_invoke_close(s, pos_, name_end)) {
          state_ = State::kBroken;
          return;
        }
        static constexpr std::string_view kAttrs[] = {" string=\"true\">", " string=\"false\">",
                                                      ">"};
        int which = -1;
        bool maybe = false;
        for (int k = 0; k < 3 && which < 0; ++k) {
          const Match m = match_at(s, name_end + 1, kAttrs[k]);
          if (m == Match::kYes) which = k;
          maybe = maybe || m == Match::kMaybe;
        }
        if (which < 0) {
          if (!maybe) state_ = State::kBroken;
          return;
        }
        key_ = std::string(s.substr(pos_, name_end - pos_));
        std::string head = params_++ > 0 ? ", " : "{";
        head += python_json_dumps(OJson(key_)) + ": ";
        pos_ = name_end + 1 + kAttrs[which].size();
        if (which == 1) {
          state_ = State::kRaw;
          value_ = pos_;
        } else {
          head += '"';
          state_ = State::kString;
          string_value_.clear();
        }
        decided(head);
        break;
      }
      case State::kString:
      case State::kRaw: {
        const std::size_t end = s.find(kParamClose, pos_);
        if (!before_invoke_close(s, pos_, end == std::string_view::npos ? s.size() : end)) {
          state_ = State::kBroken;
          return;
        }
        if (end == std::string_view::npos) {
          const std::string_view rest = s.substr(pos_);
          const std::size_t hold = std::max({partial_suffix(rest, kParamClose),
                                             partial_suffix(rest, kInvokeClose), utf8_tail(rest)});
          const std::string_view piece = rest.substr(0, rest.size() - hold);
          if (state_ == State::kString) {  // a raw value waits for its end; this is the search
            string_value_.append(piece);   // position either way
            std::string escaped;
            append_escaped(piece, escaped);
            decided(escaped);
          }
          pos_ += piece.size();
          return;
        }
        std::string tail;
        if (state_ == State::kString) {
          const std::string_view piece = s.substr(pos_, end - pos_);
          string_value_.append(piece);
          append_escaped(piece, tail);
          tail += '"';
          call_.arguments[key_] = std::move(string_value_);
        } else {
          // A value that is not valid JSON is kept as text rather than dropped.
          const std::string_view raw = s.substr(value_, end - value_);
          OJson value = std::string(raw);
          if (auto parsed = parse_json_ordered(raw)) value = std::move(*parsed);
          tail = python_json_dumps(value);
          call_.arguments[key_] = std::move(value);
        }
        decided(tail);
        pos_ = end + kParamClose.size();
        state_ = State::kBetween;
        break;
      }
      case State::kDone:
      case State::kBroken:
        return;
    }
  }
}

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

void AssistantStreamParser::abort_call(std::vector<AssistantEvent>& out) {
  if (begun_) out.push_back(AssistantEvent{AssistantEvent::Kind::kToolCallAbort, {}, {}});
  begun_ = false;
  scanner_ = InvokeScanner();
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
    // The call streams as it is generated, unless its block began in the reasoning: that one is
    // a call only once a whole invoke shows it, so it comes at once then.
    std::string delta;
    scanner_.scan(rest, delta);
    const bool dropped = single_call_ && calls_ >= 1;
    if (reasoning_calls_tag_.empty() && !dropped) {
      if (!begun_ && scanner_.named()) {
        begun_ = true;
        AssistantEvent b{AssistantEvent::Kind::kToolCallBegin, {}, {}};
        b.call.name = scanner_.call().name;
        out.push_back(std::move(b));
        delta = scanner_.call().arguments_text;  // all of it so far
      }
      // A begun call's pieces go out even when the same scan then found it malformed: what was
      // decided before that point does not depend on where the text was cut.
      if (begun_ && !delta.empty())
        out.push_back(AssistantEvent{AssistantEvent::Kind::kToolCallDelta, std::move(delta), {}});
    }
    if (scanner_.state() == InvokeScanner::State::kDone) {
      const std::size_t end = scanner_.end();
      DsmlToolCall call = std::move(scanner_.call());
      if (!reasoning_calls_tag_.empty()) {  // a real call: the block that began in the reasoning
        ++unclosed_reasoning_calls_;        // is taken as calls from here on
        reasoning_calls_tag_.clear();
        from_reasoning_ = true;
      }
      if (!dropped) {
        if (!begun_) {
          AssistantEvent b{AssistantEvent::Kind::kToolCallBegin, {}, {}};
          b.call.name = call.name;
          out.push_back(std::move(b));
          out.push_back(
              AssistantEvent{AssistantEvent::Kind::kToolCallDelta, call.arguments_text, {}});
        }
        out.push_back(AssistantEvent{AssistantEvent::Kind::kToolCall, {}, std::move(call)});
        ++calls_;
      }
      begun_ = false;
      scanner_ = InvokeScanner();
      buf_.erase(0, i + end);
      return true;
    }
    if (scanner_.state() != InvokeScanner::State::kBroken) return false;
    // Malformed: the text up to the invoke's closing tag is handed back.
    const std::size_t end = rest.find(kInvokeClose);
    if (end == std::string_view::npos) return false;
    abort_call(out);
    std::string_view invoke = rest.substr(0, end + kInvokeClose.size());
    if (!reasoning_calls_tag_.empty()) {
      // The tag in the reasoning opened no call (the model wrote about it): all of it was
      // reasoning, and the reasoning goes on.
      emit(AssistantEvent::Kind::kReasoning,
           reasoning_calls_tag_ + buf_.substr(0, i + invoke.size()), out);
      buf_.erase(0, i + invoke.size());
      reasoning_calls_tag_.clear();
      state_ = State::kReasoning;
      return true;
    }
    ++malformed_calls_;
    emit(AssistantEvent::Kind::kContent, std::string(invoke), out);
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
      abort_call(out);
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
      default:  // the streaming of a call: its end above has all of it
        break;
    }
  }
  r.reasoning_unterminated = parser.reasoning_unterminated();
  r.calls_truncated = parser.calls_truncated();
  r.malformed_calls = parser.malformed_calls();
  return r;
}

}  // namespace dsv41
