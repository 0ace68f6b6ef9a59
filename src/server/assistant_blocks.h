// Groups the assistant parser's events (text/dsml_parser.h) into the blocks the Anthropic and
// Responses APIs answer with: consecutive reasoning deltas form one block, consecutive content
// deltas another, each tool call a block of its own, in generation order; empty deltas make none.
// A tool call's block opens with its name and grows by pieces of its arguments' JSON text as they
// are generated. A stream writer is told when a block opens, grows and closes; a whole-response
// writer reads the blocks at the end. Both see the same blocks whatever the chunking of the text,
// except for a call that began streaming and then proved malformed or was cut: the stream keeps
// its block (what went out cannot be taken back), the whole response has none.
#pragma once

#include <string>
#include <vector>

#include "text/dsml_parser.h"

namespace dsv41 {

struct AssistantBlock {
  enum class Kind { kReasoning, kText, kToolCall };
  Kind kind = Kind::kText;
  std::string text;      // reasoning / text
  DsmlToolCall call;     // kToolCall: arguments_text grows with the deltas
  bool aborted = false;  // kToolCall: a streamed call that proved malformed or was cut
  // kToolCall: the arguments' JSON text; of an aborted call, the pieces that went out.
  std::string arguments() const { return aborted ? call.arguments_text : call.arguments_json(); }
};

class BlockListener {
 public:
  virtual ~BlockListener() = default;
  virtual void opened(std::size_t index, const AssistantBlock& b) = 0;
  // Reasoning and text: a piece of the text; a tool call: a piece of its arguments' JSON.
  virtual void grew(std::size_t index, const AssistantBlock& b, const std::string& delta) = 0;
  virtual void closed(std::size_t index, const AssistantBlock& b) = 0;  // b complete
};

class BlockGrouper {
 public:
  // `listener` may be null (whole-response writers). parallel_tool_calls false is the parser's
  // (AssistantStreamParser::set_single_call).
  void feed(std::vector<AssistantEvent>& events, BlockListener* listener) {
    for (AssistantEvent& e : events) {
      switch (e.kind) {
        case AssistantEvent::Kind::kToolCallBegin: {
          close(listener);
          AssistantBlock b;
          b.kind = AssistantBlock::Kind::kToolCall;
          b.call.name = std::move(e.call.name);
          blocks_.push_back(std::move(b));
          open_ = true;
          if (listener) listener->opened(blocks_.size() - 1, blocks_.back());
          continue;
        }
        case AssistantEvent::Kind::kToolCallDelta:
          if (!open_ || blocks_.back().kind != AssistantBlock::Kind::kToolCall) continue;
          blocks_.back().call.arguments_text += e.text;
          if (listener) listener->grew(blocks_.size() - 1, blocks_.back(), e.text);
          continue;
        case AssistantEvent::Kind::kToolCall:
          if (!open_ || blocks_.back().kind != AssistantBlock::Kind::kToolCall) continue;
          blocks_.back().call = std::move(e.call);
          close_last(listener);
          continue;
        case AssistantEvent::Kind::kToolCallAbort:
          if (!open_ || blocks_.back().kind != AssistantBlock::Kind::kToolCall) continue;
          if (!listener) {  // nothing went out: the whole response never shows it
            blocks_.pop_back();
            // The block before it was closed only by the call's begin: text that follows (the
            // malformed call as content) joins it, as in a parse where the call never began.
            open_ = !blocks_.empty() && blocks_.back().kind != AssistantBlock::Kind::kToolCall;
            continue;
          }
          blocks_.back().aborted = true;
          close_last(listener);
          continue;
        default:
          break;
      }
      if (e.text.empty()) continue;
      const auto kind = e.kind == AssistantEvent::Kind::kReasoning
                            ? AssistantBlock::Kind::kReasoning
                            : AssistantBlock::Kind::kText;
      if (!open_ || blocks_.back().kind != kind) {
        close(listener);
        AssistantBlock b;
        b.kind = kind;
        blocks_.push_back(std::move(b));
        open_ = true;
        if (listener) listener->opened(blocks_.size() - 1, blocks_.back());
      }
      blocks_.back().text += e.text;
      if (listener) listener->grew(blocks_.size() - 1, blocks_.back(), e.text);
    }
  }
  // The end of the output: closes the open block.
  void close(BlockListener* listener) {
    if (open_) close_last(listener);
  }
  const std::vector<AssistantBlock>& blocks() const { return blocks_; }
  bool is_open() const { return open_; }  // the last block may still grow
  int tool_calls() const {
    int n = 0;
    for (const auto& b : blocks_) n += b.kind == AssistantBlock::Kind::kToolCall && !b.aborted;
    return n;
  }

 private:
  void close_last(BlockListener* listener) {
    open_ = false;
    if (listener) listener->closed(blocks_.size() - 1, blocks_.back());
  }
  std::vector<AssistantBlock> blocks_;
  bool open_ = false;  // the last block still grows
};

}  // namespace dsv41
