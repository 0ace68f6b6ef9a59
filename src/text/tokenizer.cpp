// Tokenizer implementation (see tokenizer.h): loading and validation, added-token splitting,
// Oniguruma pre-tokenization, rank-ordered BPE with a word cache, byte-level decoding.
#include "text/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <array>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "io/text_file.h"
#include "text/byte_level.h"
#include "text/onig_regex.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;

}  // namespace

// Named, not anonymous: Tokenizer::Impl (external linkage) holds these.
namespace tokenizer_detail {

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

}  // namespace tokenizer_detail
using tokenizer_detail::AddedToken;

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;  // vocab strings (byte-level alphabet), or added content
  std::vector<char> is_added, special;
  struct PairHash {
    std::size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k); }
  };
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>, PairHash>
      merges;                                                      // (a,b) -> (rank, merged)
  std::vector<AddedToken> added;                                   // longest first
  std::array<std::vector<const AddedToken*>, 256> added_by_first;  // same order, by first byte
  std::vector<std::unique_ptr<OnigRegex>> splits;
  enum class Norm { kNone, kNFC, kNFKC } norm = Norm::kNone;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::vector<int32_t> bpe(const std::string& piece) const;  // piece in the byte-level alphabet
  void encode_plain(std::string_view text, std::vector<int32_t>* out) const;
};

std::vector<int32_t> Tokenizer::Impl::bpe(const std::string& piece) const {
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(piece);
    if (it != cache.end()) return it->second;
  }
  std::vector<int32_t> sym;
  for (std::size_t i = 0; i < piece.size();) {  // one symbol per code point of the alphabet
    std::size_t n = (uint8_t(piece[i]) < 0x80) ? 1 : (uint8_t(piece[i]) < 0xE0) ? 2 : 3;
    auto it = vocab.find(piece.substr(i, n));
    DSV41_CHECK_MSG(it != vocab.end(), "byte symbol missing from the vocabulary (checked at load)");
    sym.push_back(it->second);
    i += n;
  }
  for (;;) {  // merge the lowest-ranked adjacent pair (leftmost on ties) until none applies
    int32_t best_rank = INT32_MAX, best_id = -1;
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges.find(key(sym[i], sym[i + 1]));
      if (it != merges.end() && it->second.first < best_rank)
        best_rank = it->second.first, best_id = it->second.second, best_at = i;
    }
    if (best_id < 0) break;
    sym[best_at] = best_id;
    sym.erase(sym.begin() + long(best_at) + 1);
  }
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() > 200000) cache.clear();
  cache.emplace(piece, sym);
  return sym;
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::string normalized(text);
  if (norm != Norm::kNone) {
    UErrorCode st = U_ZERO_ERROR;
    const icu::Normalizer2* n = norm == Norm::kNFC ? icu::Normalizer2::getNFCInstance(st)
                                                   : icu::Normalizer2::getNFKCInstance(st);
    icu::UnicodeString u = n->normalize(icu::UnicodeString::fromUTF8(std::string(text)), st);
    normalized.clear();
    u.toUTF8String(normalized);
  }
  std::vector<std::string> pieces = {normalized}, next;
  for (const auto& re : splits) {
    next.clear();
    for (const auto& p : pieces) re->split_isolated(p, &next);
    pieces.swap(next);
  }
  std::string mapped;
  for (const auto& p : pieces) {
    mapped.clear();
    for (unsigned char c : p) mapped += byte_to_symbol(c);
    const auto ids = bpe(mapped);
    out->insert(out->end(), ids.begin(), ids.end());
  }
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  auto text = read_text_file(path);
  if (!text) return text.status();
  return from_json(text.value(), path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(const std::string& text,
                                                        const std::string& where) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::error(where + ": not a JSON object");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  Impl& im = *t->impl_;
  // ---- model ----
  if (!j.contains("model") || !j["model"].is_object())
    return Status::error(where + ": missing object 'model'");
  const json& m = j["model"];
  if (!m.contains("type") || m["type"] != "BPE")
    return Status::error(where + ": model.type must be \"BPE\"");
  if (m.contains("dropout") && !m["dropout"].is_null())
    return Status::error(where + ": model.dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "")
      return Status::error(where + ": model." + k + " is not supported");
  if (!m.contains("vocab") || !m["vocab"].is_object())
    return Status::error(where + ": missing object model.vocab");
  int32_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() > 1u << 30)
      return Status::error(where + ": model.vocab['" + it.key() + "'] is not a valid id");
    const auto id = it->get<int32_t>();
    im.vocab[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  // ---- added tokens ----
  std::vector<AddedToken> added;
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array())
      return Status::error(where + ": added_tokens is not an array");
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() ||
          !a.contains("content") || !a["content"].is_string() ||
          a["content"].get<std::string>().empty())
        return Status::error(where + ": malformed added_tokens entry");
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (a.contains(flag) && a[flag] == true)
          return Status::error(where + ": added token '" + a["content"].get<std::string>() +
                               "': " + flag + " = true is not supported");
      if (a.contains("normalized") && a["normalized"] == true &&
          !(j.contains("normalizer") &&
            (j["normalizer"].is_null() || (j["normalizer"].value("type", "") == "Sequence" &&
                                           j["normalizer"]["normalizers"].empty()))))
        return Status::error(where + ": added token '" + a["content"].get<std::string>() +
                             "': normalized = true with a non-empty normalizer is not supported");
      added.push_back(
          {a["content"].get<std::string>(), a["id"].get<int32_t>(), a.value("special", false)});
      max_id = std::max(max_id, added.back().id);
    }
  }
  if (max_id < 0) return Status::error(where + ": empty vocabulary");
  im.id_to_token.assign(std::size_t(max_id) + 1, std::string());
  im.is_added.assign(std::size_t(max_id) + 1, 0);
  im.special.assign(std::size_t(max_id) + 1, 0);
  std::vector<char> present(std::size_t(max_id) + 1, 0);
  for (const auto& [tok, id] : im.vocab)
    im.id_to_token[std::size_t(id)] = tok, present[std::size_t(id)] = 1;
  for (const auto& a : added) {
    im.id_to_token[std::size_t(a.id)] = a.content;
    im.is_added[std::size_t(a.id)] = 1;
    im.special[std::size_t(a.id)] = a.special;
    present[std::size_t(a.id)] = 1;
  }
  for (std::size_t id = 0; id < present.size(); ++id)
    if (!present[id])
      return Status::error(where + ": token id " + std::to_string(id) +
                           " is missing (ids must be contiguous)");
  for (std::size_t id = 0; id < present.size(); ++id)
    if (!im.is_added[id] && !symbols_to_bytes(im.id_to_token[id]))
      return Status::error(where + ": vocab token '" + im.id_to_token[id] +
                           "' is not in the byte-level alphabet");
  for (int b = 0; b < 256; ++b)
    if (!im.vocab.count(byte_to_symbol(uint8_t(b))))
      return Status::error(where + ": model.vocab lacks the byte symbol for byte " +
                           std::to_string(b));
  std::sort(added.begin(), added.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() != b.content.size() ? a.content.size() > b.content.size() : a.id < b.id;
  });
  im.added = std::move(added);
  for (const auto& a : im.added) im.added_by_first[uint8_t(a.content[0])].push_back(&a);
  // ---- merges: "a b" strings or [a, b] pairs ----
  if (!m.contains("merges") || !m["merges"].is_array())
    return Status::error(where + ": missing array model.merges");
  int32_t rank = 0;
  for (const auto& mg : m["merges"]) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size())
        return Status::error(where + ": merge " + std::to_string(rank) + " ('" + s +
                             "') is not 'A B'");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    } else {
      return Status::error(where + ": merge " + std::to_string(rank) + " is malformed");
    }
    auto ia = im.vocab.find(a), ib = im.vocab.find(b), ic = im.vocab.find(a + b);
    if (ia == im.vocab.end() || ib == im.vocab.end() || ic == im.vocab.end())
      return Status::error(where + ": merge " + std::to_string(rank) + " ('" + a + " " + b +
                           "') uses tokens not in the vocab");
    im.merges.emplace(Impl::key(ia->second, ib->second), std::make_pair(rank, ic->second));
    ++rank;
  }
  // ---- normalizer ----
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    const std::string type = n.value("type", "");
    if (type == "NFC")
      im.norm = Impl::Norm::kNFC;
    else if (type == "NFKC")
      im.norm = Impl::Norm::kNFKC;
    else if (!(type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
               n["normalizers"].empty()))
      return Status::error(where + ": normalizer '" + type +
                           "' is not supported (empty Sequence, NFC or NFKC)");
  }
  // ---- pre-tokenizer ----
  if (!j.contains("pre_tokenizer") || !j["pre_tokenizer"].is_object())
    return Status::error(where + ": missing object pre_tokenizer");
  std::vector<json> pres;
  const json& pt = j["pre_tokenizer"];
  if (pt.value("type", "") == "Sequence") {
    if (!pt.contains("pretokenizers") || !pt["pretokenizers"].is_array())
      return Status::error(where + ": pre_tokenizer.pretokenizers must be an array");
    for (const auto& p : pt["pretokenizers"]) pres.push_back(p);
  } else {
    pres.push_back(pt);
  }
  bool byte_level = false;
  for (std::size_t i = 0; i < pres.size(); ++i) {
    const json& p = pres[i];
    const std::string w = where + ": pre_tokenizer[" + std::to_string(i) + "]";
    const std::string type = p.value("type", "");
    if (type == "Split") {
      if (byte_level) return Status::error(w + ": Split after ByteLevel is not supported");
      if (!p.contains("pattern") || !p["pattern"].contains("Regex") ||
          !p["pattern"]["Regex"].is_string())
        return Status::error(w + ": only {\"Regex\": ...} patterns are supported");
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        return Status::error(w + ": only behavior Isolated without invert is supported");
      auto re = OnigRegex::compile(p["pattern"]["Regex"].get<std::string>(), w);
      if (!re) return re.status();
      im.splits.push_back(std::move(re.value()));
    } else if (type == "ByteLevel") {
      if (p.value("add_prefix_space", false) || p.value("use_regex", true))
        return Status::error(w + ": ByteLevel with add_prefix_space or use_regex is not supported");
      byte_level = true;
    } else {
      return Status::error(w + ": pre-tokenizer type '" + type + "' is not supported");
    }
  }
  if (!byte_level) return Status::error(where + ": pre_tokenizer must end with ByteLevel");
  if (!j.contains("decoder") || !j["decoder"].is_object() ||
      j["decoder"].value("type", "") != "ByteLevel")
    return Status::error(where + ": decoder must be ByteLevel");
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view raw) const {
  const Impl& im = *impl_;
  const std::string text = is_valid_utf8(raw) ? std::string(raw) : utf8_lossy(raw);
  std::vector<int32_t> out;
  std::size_t start = 0, i = 0;
  while (i < text.size()) {  // leftmost-longest added-token match
    const AddedToken* hit = nullptr;
    for (const AddedToken* a : im.added_by_first[uint8_t(text[i])])
      if (text.compare(i, a->content.size(), a->content) == 0) {
        hit = a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    im.encode_plain(std::string_view(text).substr(start, i - start), &out);
    out.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  im.encode_plain(std::string_view(text).substr(start), &out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& im = *impl_;
  DSV41_CHECK(id >= 0 && std::size_t(id) < im.id_to_token.size());
  if (im.is_added[std::size_t(id)]) return im.id_to_token[std::size_t(id)];
  return *symbols_to_bytes(im.id_to_token[std::size_t(id)]);
}

Result<std::string> Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string bytes;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (id < 0 || std::size_t(id) >= im.id_to_token.size())
      return Status::error("id " + std::to_string(id) + " at position " + std::to_string(k) +
                           " is outside the vocabulary [0, " +
                           std::to_string(im.id_to_token.size()) + ")");
    if (skip_special && im.special[std::size_t(id)]) continue;
    bytes += token_bytes(id);
  }
  return utf8_lossy(bytes);
}

int32_t Tokenizer::vocab_size() const {
  return int32_t(impl_->id_to_token.size());
}

int32_t Tokenizer::token_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && std::size_t(id) < impl_->special.size() && impl_->special[std::size_t(id)];
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && std::size_t(id) < impl_->is_added.size() && impl_->is_added[std::size_t(id)];
}

}  // namespace dsv41
