// StreamDecoder implementation (see stream_decoder.h).
#include "text/stream_decoder.h"

#include <algorithm>

#include "text/byte_level.h"

namespace dsv41 {
namespace {

// Bytes a UTF-8 sequence with this lead byte needs (1 for bytes that cannot start one).
std::size_t expected_len(uint8_t c) {
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 1;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, std::vector<std::string> stop_strings,
                             bool skip_special)
    : tok_(tok), stops_(std::move(stop_strings)), skip_special_(skip_special) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

StreamDecoder::Step StreamDecoder::push(int32_t id) {
  if (stopped_) return {};
  if (!(skip_special_ && tok_.is_special(id))) bytes_ += tok_.token_bytes(id);
  return emit(false);
}

StreamDecoder::Step StreamDecoder::finish() {
  if (stopped_) return {};
  return emit(true);
}

StreamDecoder::Step StreamDecoder::emit(bool final) {
  // Decode every complete character; hold an incomplete tail unless this is the end.
  std::size_t i = 0;
  while (i < bytes_.size()) {
    const std::size_t k = utf8_invalid_prefix(bytes_, i);
    const std::size_t need = expected_len(uint8_t(bytes_[i]));
    if (k == need && is_valid_utf8(std::string_view(bytes_).substr(i, k))) {
      text_.append(bytes_, i, k);
      i += k;
    } else if (!final && i + k == bytes_.size() && k < need) {
      break;  // may still be completed by the next token
    } else {
      text_ += "\xEF\xBF\xBD";
      i += k;
    }
  }
  bytes_.erase(0, i);
  Step step;
  // The earliest stop string wins; text before it is emitted, the rest discarded.
  std::size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const std::size_t p = text_.find(s);
    if (p != std::string::npos && p < best) best = p, step.stop = s;
  }
  if (best != std::string::npos) {
    step.text = text_.substr(0, best + (include_stop_ ? step.stop.size() : 0));
    step.stopped = stopped_ = true;
    text_.clear();
    bytes_.clear();
    return step;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  std::size_t hold = 0;
  if (!final)
    for (const auto& s : stops_)
      for (std::size_t n = std::min(s.size() - 1, text_.size()); n > hold; --n)
        if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
          hold = n;
          break;
        }
  step.text = text_.substr(0, text_.size() - hold);
  text_.erase(0, text_.size() - hold);
  return step;
}

}  // namespace dsv41
