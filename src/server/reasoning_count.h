// Counting the reasoning tokens of one generated answer from its token ids (usage's
// reasoning_tokens in every API): the tokens generated until the reasoning ended, through V4.1's
// `</think>` token (text that merely spells it out does not count), or with tools through the
// `｜DSML｜` token of a tool-call tag opened inside the reasoning (the DSML parser ends the
// reasoning there too). A generation that starts outside the reasoning has none.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "text/special_tokens.h"
#include "text/tokenizer.h"

namespace dsv41 {

class ReasoningCounter {
 public:
  ReasoningCounter(const Tokenizer& tok, bool starts_in_reasoning, bool tools)
      : think_end_(tok.token_id(tokens::kThinkEnd)),
        dsml_(tok.token_id(tokens::kDsml)),
        tools_(tools),
        in_reasoning_(starts_in_reasoning) {}
  void feed(const std::vector<OutputToken>& tokens) {
    for (const OutputToken& t : tokens) {
      if (!in_reasoning_) return;
      ++count_;
      if (t.token == think_end_ || (tools_ && t.token == dsml_)) in_reasoning_ = false;
    }
  }
  int64_t count() const { return count_; }

 private:
  int32_t think_end_, dsml_;  // -1: the tokenizer has none
  bool tools_;
  bool in_reasoning_;
  int64_t count_ = 0;
};

}  // namespace dsv41
