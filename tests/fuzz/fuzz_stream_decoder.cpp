// libFuzzer target: the streaming detokenizer over the tiny tokenizer: stop strings and token ids
// from the input; its output must be valid UTF-8 (what the server puts in JSON) and never contain
// a stop string (the text ends right before one).
#include "fuzz_util.h"
#include "text/stream_decoder.h"

namespace {

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  const Tokenizer& tok = fuzz::tiny_tokenizer();
  if (size < 1) return 0;
  std::size_t at = 1;
  std::vector<std::string> stops;
  for (int k = 0; k < (data[0] & 3) && at < size; ++k) {
    const std::size_t n = std::min<std::size_t>(1 + data[at] % 6, size - at - 1);
    if (n == 0 || at + 1 + n > size) break;
    std::string stop(reinterpret_cast<const char*>(data + at + 1), n);
    at += 1 + n;
    if (valid_utf8(stop)) stops.push_back(std::move(stop));  // requests' stops are JSON strings
  }
  std::vector<int32_t> ids;
  for (; at + 1 < size; at += 2)
    ids.push_back(int32_t((data[at] | data[at + 1] << 8) % tok.vocab_size()));
  StreamDecoder dec(tok, stops, data[0] & 4);
  std::string out;
  bool stopped = false;
  for (int32_t id : ids) {
    StreamDecoder::Step s = dec.push(id);
    out += s.text;
    if (s.stopped) {
      stopped = true;
      break;
    }
  }
  if (!stopped) out += dec.finish().text;
  if (!valid_utf8(out)) fuzz::invariant_failed("the detokenizer emitted invalid UTF-8");
  for (const auto& st : stops)
    if (out.find(st) != std::string::npos) fuzz::invariant_failed("a stop string got through");
  return 0;
}
