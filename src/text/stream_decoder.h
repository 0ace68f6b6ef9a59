// Incremental detokenization for streaming responses. Token bytes accumulate; only complete UTF-8
// is ever emitted (a character split across tokens waits for its last byte), bytes that can never
// become valid are emitted as U+FFFD at once, and an incomplete tail left at the end becomes U+FFFD
// only at finish(). Stop strings are matched on the decoded text, across token boundaries: text
// that could be the start of a stop string is held back until it is known not to be one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace dsv41 {

class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tok, std::vector<std::string> stop_strings,
                bool skip_special = true);

  struct Step {
    std::string text;      // newly emittable text (possibly empty)
    bool stopped = false;  // a stop string matched: `text` ends right before it (or with it, see
                           // set_include_stop); stop pushing
    std::string stop;      // the stop string that matched
  };
  // A matched stop string ends the text instead of being cut (vLLM's include_stop_str_in_output).
  void set_include_stop(bool on) { include_stop_ = on; }
  Step push(int32_t id);  // id must be a valid token id
  Step finish();          // end of stream: flush held text; an incomplete UTF-8 tail becomes U+FFFD

 private:
  Step emit(bool final);
  const Tokenizer& tok_;
  std::vector<std::string> stops_;
  bool skip_special_;
  std::string bytes_;  // raw bytes not yet decoded (an incomplete UTF-8 tail at most)
  std::string text_;   // decoded text not yet emitted (held back for stop-string matching)
  bool stopped_ = false;
  bool include_stop_ = false;
};

}  // namespace dsv41
