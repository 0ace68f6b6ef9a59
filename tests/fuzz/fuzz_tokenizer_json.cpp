// libFuzzer target: tokenizer.json loading (Tokenizer::from_json); a tokenizer that loads must
// encode and decode text and every id without failing its own checks.
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  auto tok = Tokenizer::from_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!tok) return 0;
  const Tokenizer& t = **tok;
  for (const char* text :
       {"Hello, world!", "  naïve café 日本語 👍🏽\n\t", "<｜User｜>hi"}) {
    auto ids = t.encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) fuzz::invariant_failed("encode gave an id out of range");
    (void)t.decode(ids, true);
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < t.vocab_size() && id < 4096; ++id) all.push_back(id);
  (void)t.decode(all, false);
  return 0;
}
