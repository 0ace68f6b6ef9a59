// Helpers of the grammar tests: a small byte-level vocabulary shaped like a real one, random walks
// that sample allowed tokens, the brute-force mask, and ajv (tests/js/grammar_judge.mjs) as the
// independent judge of generated documents.
#pragma once

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_ir.h"

namespace dsv41::grammar_test {

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Id 0 = end of sentence (the end id), 1 = a special token, then every single byte, then pieces
// the way BPE merges them (structural runs, words, digits, escapes, multi-byte UTF-8 and parts of
// it).
inline constexpr int32_t kEos = 0;
inline constexpr int32_t kSpecial = 1;
inline std::vector<std::string> small_vocab_bytes() {
  std::vector<std::string> v = {"<eos>", "<think>"};
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* s :
       {"{\"",   "\":",      "\",\"",    "\"}",      "\"]",      "},",      "}]",      "}}",
        "]}",    "[{",       "[\"",      "\":\"",    "\": ",     ", \"",    "true",    "false",
        "null",  "nul",      "ll",       "tr",       "ue",       "00",      "12",      "123",
        "2024",  "-0",       "0.",       ".5",       "e+",       "E-",      "-1",      "10",
        "99",    "name",     "age",      "value",    "children", "color",   "red",     "green",
        "kind",  "fixed",    "flag",     "code",     "free",     "alt",     "cat",     "dog",
        "bird",  "s\"",      "ab",       "abc",      "bb",       "xx",      "AB",      "-123",
        "\\n",   "\\\"",     "\\\\",     "\\u00",    "\\u0041",  "\\ud83d", "é",       "日本",
        "😀",     "\xe6\x97", "\x97\xa5", "\xf0\x9f", "  ",       "\n",      " {",      "example",
        ".org",  "@",        "T23",      ":59",      "Z\"",      "-02-",    "-29",     "e89b",
        "-a456", "counts",   "anything", "list",     "\":[",     "\":{",    "\":\"\"", ",\"",
        "\"\"",  "id",       "at",       "day",      "tags",     "email",   "\":-",    "\":0",
        "\",",   "\"},{\"",  "value\":"})
    v.push_back(s);
  return v;
}

inline std::shared_ptr<const TokenVocab> small_vocab() {
  auto v = TokenVocab::create(small_vocab_bytes(), {kSpecial}, {kEos});
  DSV41_CHECK(v.is_ok());
  return v.value();
}

inline bool bit(const std::vector<uint64_t>& w, int32_t id) {
  return (w[id >> 6] >> (id & 63)) & 1;
}

// Every token that accept_token takes from this state (the definition the mask must equal).
inline std::vector<uint64_t> brute_force_mask(const Matcher& m, const TokenVocab& v) {
  std::vector<uint64_t> w(v.mask_words(), 0);
  Matcher copy = m;
  for (int32_t id = 0; id < v.size(); ++id) {
    if (!copy.accept_token(id)) continue;
    w[id >> 6] |= uint64_t{1} << (id & 63);
    copy.rollback(1);
  }
  return w;
}

struct WalkResult {
  std::string text;
  bool finished = false;
  int mismatches = 0;  // steps where fill_mask differed from the brute force
};

// Samples allowed tokens until an end id (or max_tokens). Biased towards tokens that close
// things (quotes, brackets, digits) and towards ending when allowed, so documents stay short.
inline WalkResult random_walk(const std::shared_ptr<const Grammar>& g, std::mt19937& rng,
                              int max_tokens, bool brute_force) {
  const TokenVocab& v = g->vocab();
  Matcher m(g);
  WalkResult r;
  std::vector<uint64_t> mask(v.mask_words());
  for (int step = 0; step < max_tokens; ++step) {
    m.fill_mask(mask);
    if (brute_force && mask != brute_force_mask(m, v)) ++r.mismatches;
    std::vector<int32_t> allowed, closing;
    bool end_ok = false;
    for (int32_t id = 0; id < v.size(); ++id) {
      if (!bit(mask, id)) continue;
      if (v.is_end(id)) {
        end_ok = true;
        continue;
      }
      allowed.push_back(id);
      if (v.bytes(id).find_first_of("\"]}0123456789") != std::string::npos) closing.push_back(id);
    }
    std::uniform_real_distribution<double> u(0, 1);
    if (end_ok && (allowed.empty() || u(rng) < 0.7)) {
      EXPECT_TRUE(m.accept_token(v.end_ids()[0]));
      r.finished = true;
      return r;
    }
    if (allowed.empty()) return r;  // a dead end: the caller's expectations fail
    const auto& pool = !closing.empty() && u(rng) < 0.5 ? closing : allowed;
    int32_t id = pool[std::uniform_int_distribution<std::size_t>(0, pool.size() - 1)(rng)];
    EXPECT_TRUE(m.accept_token(id)) << "a masked-in token was refused: " << id;
    r.text += v.bytes(id);
  }
  return r;
}

// A node's token sets as comparable values: the accepted ids (bitset or list form alike) and the
// uncertain ids in order with their common prefixes.
inline bool same_masks(const grammar_detail::NodeMasks& x, const grammar_detail::NodeMasks& y,
                       const TokenVocab& v) {
  auto accepted = [&](const grammar_detail::NodeMasks& m) {
    std::vector<uint64_t> w = m.accept_bits;
    w.resize(v.mask_words(), 0);
    for (int32_t id : m.accept_list) w[id >> 6] |= uint64_t{1} << (id & 63);
    return w;
  };
  return accepted(x) == accepted(y) && x.uncertain == y.uncertain &&
         x.uncertain_lcp == y.uncertain_lcp;
}

// Every node's sets as the grammar derives them (from equivalent nodes computed before, visited in
// a random order so the bases vary; or shared) and as derived from `bases_per_node` random other
// nodes of its leaf rule, each against the plain walk from the node alone. Returns how many nodes
// the grammar shared with another (a pointer to the same sets).
inline int expect_derived_masks_equal_walks(const Grammar& g, std::mt19937& rng,
                                            int bases_per_node) {
  using namespace grammar_detail;
  const Automaton& a = g.automaton();
  const TokenVocab& v = g.vocab();
  const uint32_t nn = a.num_nodes();
  std::vector<NodeMasks> plain;
  for (uint32_t n = 0; n < nn; ++n) plain.push_back(compute_node_masks(a, v, n));
  std::vector<uint32_t> order(nn);
  for (uint32_t n = 0; n < nn; ++n) order[n] = n;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<const NodeMasks*> got(nn);
  for (uint32_t n : order) {
    got[n] = &g.node_masks(n);
    EXPECT_TRUE(same_masks(*got[n], plain[n], v)) << "node " << n << " (memo)";
  }
  std::vector<const NodeMasks*> sorted(got);
  std::sort(sorted.begin(), sorted.end());
  const int shared =
      static_cast<int>(nn - (std::unique(sorted.begin(), sorted.end()) - sorted.begin()));
  const Equivalence eq = build_equivalence(a, v.max_depth());
  for (uint32_t n = 0; n < nn; ++n) {
    const uint32_t rule = a.rule_of[n];
    const Equivalence::Rule& r = eq.rules[rule];
    if (r.slots == 0) continue;
    for (int k = 0; k < bases_per_node; ++k) {
      const uint32_t base = r.first + std::uniform_int_distribution<uint32_t>(0, r.n - 1)(rng);
      EXPECT_TRUE(same_masks(compute_node_masks(a, v, n, &eq, base, &plain[base]), plain[n], v))
          << "node " << n << " from base " << base;
    }
  }
  return shared;
}

// ajv's verdict per document: cases = [{"schema": ..., "docs": [text, ...]}].
inline nlohmann::ordered_json ajv_judge(const nlohmann::ordered_json& cases) {
  std::string in =
      std::string(::testing::TempDir()) + "/grammar_judge_" + std::to_string(::getpid()) + ".json";
  std::ofstream(in) << cases.dump();
  std::string cmd = "cd " + std::string(DSV41_JS_DIR) + " && node grammar_judge.mjs " + in;
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && !std::feof(p)) {
    std::size_t n = std::fread(buf, 1, sizeof buf, p);
    out.append(buf, n);
  }
  int rc = p ? ::pclose(p) : -1;
  std::remove(in.c_str());
  EXPECT_EQ(rc, 0) << "node grammar_judge.mjs failed (run scripts/setup.sh for ajv): " << out;
  auto j = nlohmann::ordered_json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << out;
  return j;
}

}  // namespace dsv41::grammar_test
