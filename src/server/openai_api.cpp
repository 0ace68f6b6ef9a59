// OpenAI field validation and response/chunk JSON. Unknown fields are ignored (as OpenAI and vLLM
// do); every known field is type- and range-checked, and unsupported values are refused with a 400
// naming the field rather than silently ignored.
#include "server/openai_api.h"
#include "server/forced_tools.h"
#include "server/image_inputs.h"
#include "server/request_fields.h"
#include "server/structured_outputs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "text/byte_level.h"
#include "text/chat.h"
#include "text/special_tokens.h"

namespace dsv41 {
namespace {

// Token ids: JSON integers in [0, vocab). The JSON library stores every non-negative integer as
// unsigned (and only negative ones as signed), so both representations are read.
bool token_ids(const OJson& v, int32_t vocab, const std::string& param, std::vector<int32_t>& out,
               std::optional<ApiError>& err) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const OJson& t = v[i];
    if (!t.is_number_integer()) {
      err = bad(param, fmt::format("element {} is not an integer token id", i));
      return false;
    }
    const bool in_range = t.is_number_unsigned()
                              ? t.get<uint64_t>() < static_cast<uint64_t>(vocab)
                              : t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab;
    if (!in_range) {
      err = bad(param, fmt::format("token id {} at position {} is outside the vocabulary [0, {})",
                                   dump_safe(t), i, vocab));
      return false;
    }
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return true;
}

// Fields that vLLM's or DeepSeek's API documents and this server does not implement: a request
// that sets one to anything but its no-op value (`noop`, JSON text; null: any value) is refused
// naming it, never silently ignored (docs/server.md lists what each API accepts).
struct RefusedField {
  const char* name;
  const char* noop;
  const char* why;
};
constexpr RefusedField kRefusedFields[] = {
    {"use_beam_search", "false", "beam search is not implemented"},
    {"length_penalty", "1", "beam search is not implemented"},
    {"allowed_token_ids", nullptr, "not implemented (logit_bias can restrict tokens)"},
    {"guided_json", nullptr,
     "vLLM's old guided fields are not implemented (structured_outputs or response_format are)"},
    {"guided_regex", nullptr,
     "vLLM's old guided fields are not implemented (structured_outputs or response_format are)"},
    {"guided_choice", nullptr,
     "vLLM's old guided fields are not implemented (structured_outputs or response_format are)"},
    {"guided_grammar", nullptr, "guided decoding is not implemented"},
    {"guided_decoding_backend", nullptr, "guided decoding is not implemented"},
    {"guided_whitespace_pattern", nullptr, "guided decoding is not implemented"},
    {"logits_processors", nullptr, "custom logits processors are not supported"},
    {"prompt_embeds", nullptr, "prompts are text or token ids"},
    {"spaces_between_special_tokens", "true", "special tokens are decoded as they are"},
    {"return_tokens_as_token_ids", "false", "not implemented (return_token_ids gives the ids)"},
    {"priority", "0", "requests are served in arrival order"},
    {"kv_transfer_params", nullptr, "disaggregated serving is not implemented"},
    {"vllm_xargs", nullptr, "not supported"},
    {"mm_processor_kwargs", nullptr, "this server runs the text model"},
    // vLLM's default is false for chat (the template adds BOS) and true for completions; here
    // neither adds special tokens beyond the chat encoding's BOS and FIM's, so only false is a
    // no-op.
    {"add_special_tokens", "false",
     "prompts are tokenized as they are (chat: the V4.1 encoding adds BOS itself)"},
};
constexpr RefusedField kRefusedChatFields[] = {
    {"chat_template", nullptr, "the V4.1 chat encoding is built in"},
    {"documents", nullptr, "not supported by the V4.1 chat encoding"},
    {"echo", "false", "not implemented for chat (completions have echo)"},
};

bool is_noop(const OJson& v, const char* noop) {
  if (!noop) return false;
  const OJson want = OJson::parse(noop);
  if (v.is_number() && want.is_number()) return v.get<double>() == want.get<double>();
  return v == want;
}

std::optional<ApiError> refuse_unsupported(const OJson& body, bool chat) {
  auto check = [&](const RefusedField& r) -> std::optional<ApiError> {
    const auto it = body.find(r.name);
    if (it == body.end() || it->is_null() || is_noop(*it, r.noop)) return std::nullopt;
    return bad(r.name, fmt::format("is not supported by this server: {}", r.why));
  };
  for (const RefusedField& r : kRefusedFields)
    if (auto e = check(r)) return e;
  if (chat)
    for (const RefusedField& r : kRefusedChatFields)
      if (auto e = check(r)) return e;
  return std::nullopt;
}

// vLLM's output and sampling fields beyond OpenAI's (both endpoints): repetition_penalty,
// min_tokens, bad_words (tokenized as they are and after a space, as vLLM does),
// include_stop_str_in_output, skip_special_tokens, return_token_ids.
std::optional<ApiError> parse_vllm_fields(Fields& f, const Tokenizer& tok, GenerationJob& job) {
  SamplingParams& s = job.request.sampling;
  if (const OJson* rp = f.get("repetition_penalty")) {
    if (!rp->is_number() || !(rp->get<double>() > 0) || !(rp->get<double>() <= 100))
      return bad("repetition_penalty", "must be a number in (0, 100] (1: off)");
    s.repetition_penalty = rp->get<double>();
  }
  int64_t min_tokens = 0;
  if (!f.integer("min_tokens", 0, std::numeric_limits<int32_t>::max(), min_tokens)) return f.err;
  s.min_tokens = static_cast<int>(min_tokens);
  if (const OJson* bw = f.get("bad_words")) {
    if (!bw->is_array()) return bad("bad_words", "must be an array of strings");
    for (const OJson& w : *bw) {
      if (!w.is_string() || w.get<std::string>().empty())
        return bad("bad_words", "must hold non-empty strings");
      for (const std::string& form : {w.get<std::string>(), " " + w.get<std::string>()}) {
        std::vector<int32_t> ids = tok.encode(form);
        if (!ids.empty() &&
            std::find(s.bad_words_ids.begin(), s.bad_words_ids.end(), ids) == s.bad_words_ids.end())
          s.bad_words_ids.push_back(std::move(ids));
      }
    }
  }
  if (!f.boolean("include_stop_str_in_output", s.include_stop_str_in_output)) return f.err;
  if (!f.boolean("skip_special_tokens", s.skip_special_tokens)) return f.err;
  if (!f.boolean("return_token_ids", job.return_token_ids)) return f.err;
  return std::nullopt;
}

// vLLM's truncate_prompt_tokens: the prompt's last N tokens are kept (-1: as many as the context
// leaves room for); after tokenization, before the context check.
std::optional<ApiError> truncate_prompt(Fields& f, const ServedModel& model, GenerationJob& job) {
  const OJson* t = f.get("truncate_prompt_tokens");
  if (!t) return std::nullopt;
  int64_t keep = 0;
  if (!f.integer("truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max(), keep))
    return f.err;
  if (keep == 0) return bad("truncate_prompt_tokens", "must be -1 or at least 1");
  if (keep < 0) keep = model.max_context - 1;
  std::vector<int32_t>& p = job.request.prompt;
  if (int64_t(p.size()) > keep) p.erase(p.begin(), p.end() - keep);
  return std::nullopt;
}

// Fields shared by both endpoints: model, n, stream, sampling, stops.
std::optional<ApiError> parse_common(const OJson& body, const ServedModel& model,
                                     const Tokenizer& tok, GenerationJob& job) {
  const int32_t vocab = tok.vocab_size();
  if (!body.is_object()) return bad("", "the request body must be a JSON object");
  auto m = body.find("model");
  if (m == body.end() || m->is_null()) return bad("model", "required field missing");
  if (!m->is_string()) return bad("model", "must be a string");
  if (!model.serves(m->get<std::string>())) return model_not_found(m->get<std::string>(), model);
  job.model = model.name;
  Fields f(body);
  SamplingParams& s = job.request.sampling;
  model.sampling_defaults.apply(s);  // the request's own fields, read below, win
  int64_t n = 1, top_k = s.top_k, seed = 0;
  double freq = 0, pres = 0;
  if (!f.integer("n", 1, 128, n)) return f.err;
  job.n = static_cast<int>(n);
  int64_t best_of = n;  // OpenAI: best_of >= n; its default is n
  if (!f.integer("best_of", 1, 128, best_of)) return f.err;
  if (best_of < n) return bad("best_of", "must be at least n");
  if (best_of != n)
    return bad("best_of", "only best_of equal to n is supported (every sample is returned)");
  if (!f.boolean("stream", job.stream)) return f.err;
  int64_t prompt_lp = -1;  // vLLM's field: each prompt token's logprob + that many top ones
  if (!f.integer("prompt_logprobs", 0, kMaxTopLogprobs, prompt_lp)) return f.err;
  if (prompt_lp >= 0 && job.stream)
    return bad("prompt_logprobs", "is not supported with stream=true (ask without streaming)");
  s.prompt_logprobs = static_cast<int>(prompt_lp);
  if (const OJson* so = f.get("stream_options")) {
    if (!job.stream) return bad("stream_options", "only allowed when stream is true");
    if (!so->is_object()) return bad("stream_options", "must be an object");
    Fields sf(*so);
    if (!sf.boolean("include_usage", job.include_usage))
      return bad("stream_options.include_usage", "must be a boolean");
    bool continuous = false;  // vLLM's: usage in every chunk
    if (!sf.boolean("continuous_usage_stats", continuous))
      return bad("stream_options.continuous_usage_stats", "must be a boolean");
    if (continuous)
      return bad("stream_options.continuous_usage_stats",
                 "is not supported (include_usage sends the usage after the last choice)");
  }
  if (auto e = refuse_unsupported(body, job.chat)) return e;
  if (const OJson* rid = f.get("request_id")) {
    // It goes out in a header and in log lines: visible ASCII only, bounded.
    const std::string v = rid->is_string() ? rid->get<std::string>() : "";
    if (v.empty() || v.size() > 128 ||
        !std::all_of(v.begin(), v.end(), [](char c) { return c > ' ' && c < 0x7f; }))
      return bad("request_id", "must be a string of 1-128 visible ASCII characters (no spaces)");
    job.request_id = v;
  }
  if (auto e = parse_vllm_fields(f, tok, job)) return e;
  if (!f.number("temperature", 0, 2, false, s.temperature)) return f.err;
  if (!f.number("top_p", 0, 1, true, s.top_p)) return f.err;
  if (!f.integer("top_k", -1, std::numeric_limits<int32_t>::max(), top_k)) return f.err;
  s.top_k = static_cast<int>(top_k);
  if (!f.number("min_p", 0, 1, false, s.min_p)) return f.err;
  if (!f.number("presence_penalty", -2, 2, false, pres)) return f.err;
  if (!f.number("frequency_penalty", -2, 2, false, freq)) return f.err;
  s.presence_penalty = pres;
  s.frequency_penalty = freq;
  if (f.get("seed")) {
    if (!f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                   seed))
      return f.err;
    s.seed = static_cast<uint64_t>(seed);
  }
  if (!f.boolean("ignore_eos", s.ignore_eos)) return f.err;
  if (const OJson* salt = f.get("cache_salt")) {  // vLLM's: requests with other salts never share
    if (!salt->is_string() || salt->get<std::string>().empty())
      return bad("cache_salt", "must be a non-empty string");
    job.request.cache_salt = salt->get<std::string>();
  }
  if (const OJson* lb = f.get("logit_bias")) {
    if (!lb->is_object()) return bad("logit_bias", "must be an object mapping token ids to biases");
    for (const auto& [key, val] : lb->items()) {
      char* end = nullptr;
      errno = 0;
      long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id >= vocab)
        return bad("logit_bias", fmt::format("key '{}' is not a token id in [0, {})", key, vocab));
      if (!val.is_number() || !(val.get<double>() >= -100 && val.get<double>() <= 100))
        return bad("logit_bias",
                   fmt::format("bias for token {} must be a number in [-100, 100]", key));
      s.logit_bias.emplace_back(static_cast<int32_t>(id), val.get<float>());
    }
  }
  if (const OJson* st = f.get("stop")) {
    if (st->is_string()) {
      s.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) return bad("stop", "at most 16 stop strings");
      for (const auto& x : *st) {
        if (!x.is_string()) return bad("stop", "must be a string or an array of strings");
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "must be a string or an array of strings");
    }
    for (const auto& x : s.stop)
      if (x.empty()) return bad("stop", "stop strings must not be empty");
  }
  if (const OJson* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) return bad("stop_token_ids", "must be an array of token ids");
    std::optional<ApiError> err;
    if (!token_ids(*ids, vocab, "stop_token_ids", s.stop_token_ids, err)) return err;
  }
  if (const OJson* u = f.get("user"); u && !u->is_string()) return bad("user", "must be a string");
  return std::nullopt;
}

}  // namespace

namespace {

// tool_choice: "auto", "none", "required" or {"type": "function", "function": {"name": N}}.
std::optional<ApiError> read_chat_tool_choice(const OJson& tc, ToolForcing& out) {
  if (tc.is_string()) {
    const std::string s = tc.get<std::string>();
    if (s == "auto") return std::nullopt;
    if (s == "none" || s == "required") {
      out.mode = s == "none" ? ToolForcing::Mode::kNone : ToolForcing::Mode::kRequired;
      return std::nullopt;
    }
    return bad("tool_choice",
               "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
               "\"function\": {\"name\": ...}}");
  }
  if (!tc.is_object() || tc.value("type", OJson()) != "function")
    return bad("tool_choice",
               "an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
  const auto fn = tc.find("function");
  if (fn == tc.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
    return bad("tool_choice.function.name", "required (the name of a tool in tools)");
  out.mode = ToolForcing::Mode::kNamed;
  out.name = (*fn)["name"].get<std::string>();
  return std::nullopt;
}

// Structured outputs (response_format, structured_outputs; server/structured_outputs.h): compiled
// here, on the request's thread, once every cheaper check passed; a 400 names the field (and a
// schema keyword's path).
std::optional<ApiError> structured_output(const OJson& body, const ServedModel& model,
                                          const Tokenizer& tok, GenerationJob& job) {
  return parse_structured_output(body, tok, *model.grammars, job);
}

std::optional<ApiError> parse_max_tokens(Fields& f, const char* name, int default_value,
                                         GenerationJob& job) {
  int64_t mt = default_value;
  if (!f.integer(name, 1, std::numeric_limits<int32_t>::max(), mt)) return f.err;
  job.request.sampling.max_tokens = static_cast<int>(mt);
  if (f.get(name)) job.max_tokens_param = name;
  return std::nullopt;
}

}  // namespace

std::string error_body(const ApiError& e) {
  OJson err = OJson::object();
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? OJson(nullptr) : OJson(e.param);
  err["code"] = e.code.empty() ? OJson(nullptr) : OJson(e.code);
  OJson body = OJson::object();
  body["error"] = std::move(err);
  return dump_safe(body);
}

namespace {

// DeepSeek's fill-in-the-middle prompt (prefix-suffix-middle order, as DeepSeek's models were
// trained on it): BOS, <｜fim▁begin｜>, the text before the hole, <｜fim▁hole｜>, the text after
// it, <｜fim▁end｜>; the model writes the middle. A tokenizer without the three tokens cannot.
std::optional<ApiError> fim_prompt(const Tokenizer& tok, const std::string& prefix,
                                   const std::string& suffix, std::vector<int32_t>& out) {
  int32_t ids[4];
  const char* names[4] = {tokens::kBos, tokens::kFimBegin, tokens::kFimHole, tokens::kFimEnd};
  for (int i = 0; i < 4; ++i) {
    ids[i] = tok.token_id(names[i]);
    if (ids[i] < 0)
      return bad("suffix", fmt::format("fill-in-the-middle needs the token {}, which this model's "
                                       "tokenizer does not have",
                                       names[i]));
  }
  out = {ids[0], ids[1]};
  const auto pre = tok.encode(prefix), suf = tok.encode(suffix);
  out.insert(out.end(), pre.begin(), pre.end());
  out.push_back(ids[2]);
  out.insert(out.end(), suf.begin(), suf.end());
  out.push_back(ids[3]);
  return std::nullopt;
}

}  // namespace

OJson with_default_kwargs(const OJson& body, const ServedModel& model) {
  if (model.default_chat_template_kwargs.empty() || !body.is_object()) return body;
  const auto own = body.find("chat_template_kwargs");
  if (own != body.end() && !own->is_null() && !own->is_object()) return body;
  OJson merged = body;
  OJson kwargs = model.default_chat_template_kwargs;
  if (own != body.end() && !own->is_null())
    for (const auto& [k, v] : own->items()) kwargs[k] = v;
  merged["chat_template_kwargs"] = std::move(kwargs);
  return merged;
}

void apply_reasoning_budget(const ServedModel& model, int64_t asked, GenerationJob& job) {
  int64_t cap = model.reasoning_budget;
  if (asked >= 0) cap = cap < 0 ? asked : std::min(cap, asked);
  job.request.sampling.thinking_token_budget = job.thinking && cap >= 0 ? int(cap) : -1;
}

std::optional<ApiError> parse_completion_request(const OJson& body, const ServedModel& model,
                                                 const Tokenizer& tok, GenerationJob& job) {
  const int32_t vocab = tok.vocab_size();
  job.chat = false;
  if (auto e = parse_common(body, model, tok, job)) return e;
  Fields f(body);
  bool echo = false;
  if (!f.boolean("echo", echo)) return f.err;
  job.echo_prompt = echo;
  // max_tokens 0 asks for the prompt's logprobs alone (lm-eval's loglikelihood requests); vLLM
  // allows it with echo only.
  if (const OJson* mt = f.get("max_tokens"); mt && mt->is_number_integer() && *mt == 0) {
    if (!echo)
      return bad("max_tokens",
                 "0 is only allowed with echo=true (scoring the prompt without generating)");
    job.score_only = true;
    job.request.sampling.max_tokens = 1;
    job.max_tokens_param = "max_tokens";
  } else if (auto e = parse_max_tokens(f, "max_tokens", 16, job)) {
    return e;
  }
  int64_t logprobs = -1;
  if (!f.integer("logprobs", 0, kMaxTopLogprobs, logprobs)) return f.err;
  job.request.sampling.logprobs = static_cast<int>(logprobs);
  job.want_logprobs = logprobs >= 0;
  // Echoed logprobs cover the prompt: its logprobs are asked of the engine (vLLM: prompt_logprobs
  // defaults to logprobs with echo), top `logprobs` of them shown.
  if (echo && logprobs >= 0 && job.request.sampling.prompt_logprobs < 0)
    job.request.sampling.prompt_logprobs = static_cast<int>(logprobs);
  // DeepSeek's FIM completion: the text after the hole (an empty suffix is a plain completion).
  std::string suffix;
  if (const OJson* sfx = f.get("suffix")) {
    if (!sfx->is_string()) return bad("suffix", "must be a string");
    suffix = sfx->get<std::string>();
  }
  const OJson* p = f.get("prompt");
  if (!p) return bad("prompt", "required field missing");
  std::optional<ApiError> err;
  bool ids = false;  // the prompt came as token ids: echo returns them decoded
  if (p->is_string()) {
    job.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    if (!token_ids(*p, vocab, "prompt", job.request.prompt, err)) return err;
    ids = true;
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    job.prompt_text = (*p)[0].get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
    if (!token_ids((*p)[0], vocab, "prompt", job.request.prompt, err)) return err;
    ids = true;
  } else if (p->is_array() && p->size() > 1) {
    return bad("prompt", "batched prompts are not supported; send one prompt per request");
  } else {
    return bad("prompt",
               "must be a string, an array of token ids, or a one-element array of either");
  }
  if (!suffix.empty()) {
    if (ids)
      return bad("suffix", "fill-in-the-middle needs a string prompt (the text before the hole)");
    if (echo) return bad("echo", "is not supported with suffix (fill-in-the-middle)");
    if (auto e = fim_prompt(tok, job.prompt_text, suffix, job.request.prompt)) return e;
  } else if (!ids) {
    job.request.prompt = tok.encode(job.prompt_text);
  } else if (echo) {
    auto text = tok.decode(job.request.prompt);  // ids are in range: cannot fail
    if (!text) return bad("prompt", text.status().message());
    job.prompt_text = std::move(*text);
  }
  if (!echo) job.prompt_text.clear();
  if (auto e = truncate_prompt(f, model, job)) return e;
  if (auto e = check_prompt_length(job, model, "prompt")) return e;
  return structured_output(body, model, tok, job);
}

std::optional<ApiError> parse_chat_completion_request(const OJson& body, const ServedModel& model,
                                                      const Tokenizer& tok, GenerationJob& job) {
  job.chat = true;
  if (auto e = parse_common(body, model, tok, job)) return e;
  Fields f(body);
  const int chat_default = model.default_max_tokens();
  if (auto e = parse_max_tokens(f, "max_tokens", chat_default, job)) return e;
  if (f.get("max_completion_tokens"))
    if (auto e = parse_max_tokens(f, "max_completion_tokens", chat_default, job)) return e;
  bool logprobs = false;
  int64_t top = 0;
  if (!f.boolean("logprobs", logprobs)) return f.err;
  if (!f.integer("top_logprobs", 0, kMaxTopLogprobs, top)) return f.err;
  if (f.get("top_logprobs") && !logprobs)
    return bad("top_logprobs", "requires logprobs to be true");
  job.want_logprobs = logprobs;
  job.request.sampling.logprobs = logprobs ? static_cast<int>(top) : -1;
  bool parallel = true;
  if (!f.boolean("parallel_tool_calls", parallel)) return f.err;
  job.single_tool_call = !parallel;
  int64_t budget = -1;  // vLLM's thinking_token_budget
  if (!f.integer("thinking_token_budget", 0, std::numeric_limits<int32_t>::max(), budget))
    return f.err;
  ToolForcing forcing;
  if (const OJson* tc = f.get("tool_choice"))
    if (auto e = read_chat_tool_choice(*tc, forcing)) return e;
  auto req = parse_chat_request(with_default_kwargs(body, model));
  if (!req) {
    const std::string& msg = req.status().message();
    const std::size_t colon = msg.find(": ");
    ApiError e;
    e.message = msg;
    e.param = colon == std::string::npos ? "messages" : msg.substr(0, colon);
    return e;
  }
  auto prompt = encode_chat(req->messages, req->options);
  if (!prompt) return bad("messages", prompt.status().message());
  // A continued final message (prefix: true, continue_final_message) may have closed the
  // reasoning already.
  job.thinking = generation_starts_in_reasoning(req->messages, req->options);
  apply_reasoning_budget(model, budget, job);
  const std::vector<OJson> functions = declared_functions(req->messages);
  std::vector<bool> strict(functions.size());
  for (std::size_t i = 0; i < functions.size(); ++i) {
    bool on = false;
    if (auto e = read_tool_strict(functions[i], fmt::format("tools[{}].function.strict", i), on))
      return e;
    strict[i] = on;
  }
  if (auto e = check_tool_forcing(forcing, functions, {})) return e;
  job.extract_tools = !functions.empty() && forcing.mode != ToolForcing::Mode::kNone;
  job.request.prompt = tok.encode(*prompt);
  // Image parts: the placeholders become the images' spans.
  if (auto e = expand_chat_images(req->messages, model, job)) return e;
  if (!job.request.images.empty() && f.get("truncate_prompt_tokens"))
    return bad("truncate_prompt_tokens", "cannot cut a prompt with images");
  if (auto e = truncate_prompt(f, model, job)) return e;
  if (auto e = check_prompt_length(job, model, "messages")) return e;
  if (auto e = structured_output(body, model, tok, job)) return e;
  // tool_choice required / a named function: the answer is a calls block of the tools' schemas.
  if (auto e = force_tool_calls(forcing, functions, {}, tok, *model.grammars, job)) return e;
  // tool_choice auto with strict tools: a call the model begins follows its tool's schema.
  if (auto e = constrain_strict_tools(forcing, functions, strict, {}, tok, *model.grammars, job))
    return e;
  // In thinking mode the constraint applies to the answer: it starts when the reasoning closes.
  job.request.constraint_after_reasoning = job.thinking && job.request.constraint != nullptr;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Responses

ResponseBuilder::ResponseBuilder(const GenerationJob& job, const Tokenizer& tok, std::string id,
                                 int64_t created, int index)
    : job_(job),
      tok_(tok),
      id_(std::move(id)),
      created_(created),
      index_(index),
      parser_(job.thinking, job.extract_tools),
      reasoning_(tok, job.thinking, job.extract_tools) {
  parser_.set_single_call(job.single_tool_call);  // parallel_tool_calls: false
}

// Completions with echo: the prompt's entries of the legacy arrays (vLLM's): the first prompt
// token has no logprob (null, and null top_logprobs); each later one its logprob and a map of the
// `logprobs` most likely tokens plus itself. Offsets advance by token bytes, as for generated
// tokens.
void ResponseBuilder::prompt_logprob_entries(OJson& toks, OJson& tlp, OJson& top, OJson& off) {
  const std::vector<int32_t>& prompt = job_.request.prompt;
  const auto shown = static_cast<std::size_t>(std::max(0, job_.request.sampling.logprobs));
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    const std::string bytes = tok_.token_bytes(prompt[i]);
    toks.push_back(utf8_lossy(bytes));
    off.push_back(text_offset_);
    text_offset_ += static_cast<int64_t>(bytes.size());
    // Entry i - 1 is position i's (position 0 has none); one missing (a request cancelled
    // mid-prompt) reads as null.
    if (i == 0 || i - 1 >= prompt_lp_.size()) {
      tlp.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    const PromptLogprob& p = prompt_lp_[i - 1];
    tlp.push_back(p.logprob);
    OJson m = OJson::object();
    for (std::size_t k = 0; k < std::min(shown, p.top.size()); ++k)
      m[utf8_lossy(tok_.token_bytes(p.top[k].token))] = p.top[k].logprob;
    m[utf8_lossy(bytes)] = p.logprob;
    top.push_back(std::move(m));
  }
}

OJson ResponseBuilder::logprobs_json(const std::vector<OutputToken>& tokens, bool with_prompt) {
  auto bytes_of = [&](int32_t id) {
    std::string b = tok_.token_bytes(id);
    OJson arr = OJson::array();
    for (unsigned char c : b) arr.push_back(static_cast<int>(c));
    return std::make_pair(utf8_lossy(b), arr);
  };
  if (job_.chat) {
    OJson content = OJson::array();
    for (const auto& t : tokens) {
      auto [s, b] = bytes_of(t.token);
      OJson e = OJson::object();
      e["token"] = s;
      e["logprob"] = t.logprob;
      e["bytes"] = b;
      OJson top = OJson::array();
      for (const auto& x : t.top) {
        auto [ts, tb] = bytes_of(x.token);
        OJson te = OJson::object();
        te["token"] = ts;
        te["logprob"] = x.logprob;
        te["bytes"] = tb;
        top.push_back(std::move(te));
      }
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    OJson lp = OJson::object();
    lp["content"] = std::move(content);
    return lp;
  }
  OJson lp = OJson::object();
  OJson toks = OJson::array(), tlp = OJson::array(), top = OJson::array(), off = OJson::array();
  if (with_prompt) prompt_logprob_entries(toks, tlp, top, off);
  for (const auto& t : tokens) {
    toks.push_back(utf8_lossy(tok_.token_bytes(t.token)));
    tlp.push_back(t.logprob);
    OJson m = OJson::object();
    for (const auto& x : t.top) m[utf8_lossy(tok_.token_bytes(x.token))] = x.logprob;
    top.push_back(std::move(m));
    off.push_back(text_offset_);
    text_offset_ += static_cast<int64_t>(tok_.token_bytes(t.token).size());
  }
  lp["tokens"] = std::move(toks);
  lp["token_logprobs"] = std::move(tlp);
  lp["top_logprobs"] = std::move(top);
  lp["text_offset"] = std::move(off);
  return lp;
}

// vLLM's PromptLogprobs: null for the first prompt token, then per token {"id": {logprob, rank,
// decoded_token}} with the prompt token and the top ones (ranks 1..k).
OJson ResponseBuilder::prompt_logprobs_json() const {
  auto entry = [&](int32_t id, float lp, int32_t rank) {
    OJson e = OJson::object();
    e["logprob"] = lp;
    e["rank"] = rank;
    e["decoded_token"] = utf8_lossy(tok_.token_bytes(id));
    return e;
  };
  OJson list = OJson::array();
  list.push_back(nullptr);
  for (const PromptLogprob& p : prompt_lp_) {
    OJson m = OJson::object();
    m[std::to_string(p.token)] = entry(p.token, p.logprob, p.rank);
    for (std::size_t i = 0; i < p.top.size(); ++i)
      if (p.top[i].token != p.token)
        m[std::to_string(p.top[i].token)] = entry(p.top[i].token, p.top[i].logprob, int32_t(i + 1));
    list.push_back(std::move(m));
  }
  return list;
}

// OpenAI's usage with its details (cached prompt tokens: those the request's first admission took
// from the prefix cache; reasoning tokens: told by the token ids) and DeepSeek's split of the
// prompt into cache hits and misses.
OJson ResponseBuilder::usage_json(int64_t completion_tokens, int64_t reasoning_tokens) const {
  OJson u = OJson::object();
  u["prompt_tokens"] = prompt_tokens_;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens_ + completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens_}};
  u["completion_tokens_details"] = {{"reasoning_tokens", reasoning_tokens}};
  u["prompt_cache_hit_tokens"] = cached_tokens_;
  u["prompt_cache_miss_tokens"] = prompt_tokens_ - cached_tokens_;
  return u;
}

std::string ResponseBuilder::finish_reason() const {
  if (reason_ == FinishReason::kLength || job_.score_only) return "length";
  // Streamed: the calls that completed (one that began and then proved malformed is content in
  // the whole response, which says "stop").
  if (!calls_.empty() || tool_calls_done_ > 0) return "tool_calls";
  return "stop";
}

void ResponseBuilder::absorb(const RequestOutput& out, std::vector<AssistantEvent>& events) {
  prompt_lp_.insert(prompt_lp_.end(), out.prompt_logprobs.begin(), out.prompt_logprobs.end());
  if (!job_.score_only) completion_tokens_ += static_cast<int64_t>(out.tokens.size());
  if (job_.chat) reasoning_.feed(out.tokens);
  if (job_.chat) {
    parser_.feed(out.text, events);
    if (out.finished) parser_.finish(events);
  }
  if (out.finished) {
    finished_ = true;
    reason_ = out.reason;
    prompt_tokens_ = out.prompt_tokens;
    cached_tokens_ = std::min(out.cached_prompt_tokens, out.prompt_tokens);
    completion_tokens_ = job_.score_only ? 0 : out.completion_tokens;
  }
}

std::string ResponseBuilder::stream_preamble() const {
  OJson delta = OJson::object();
  delta["role"] = "assistant";
  delta["content"] = "";
  OJson choice = OJson::object();
  choice["index"] = index_;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  OJson c = OJson::object();
  c["id"] = id_;
  c["object"] = "chat.completion.chunk";
  c["created"] = created_;
  c["model"] = job_.model;
  c["choices"] = OJson::array({std::move(choice)});
  return dump_safe(c);
}

std::vector<std::string> ResponseBuilder::stream_chunks(const RequestOutput& out) {
  std::vector<AssistantEvent> events;
  absorb(out, events);
  std::vector<std::string> chunks;
  // Completions with echo: the prompt (and its logprobs) go out with the first output that has
  // tokens or ends the request, as vLLM sends them; score_only drops the sampled token.
  const std::vector<OutputToken> none;
  const std::vector<OutputToken>& tokens = job_.score_only ? none : out.tokens;
  std::string text = job_.score_only ? std::string() : out.text;
  const bool ended_ok =
      out.finished && out.reason != FinishReason::kError && out.reason != FinishReason::kCancelled;
  const bool echo_now = job_.echo_prompt && !echoed_ && (!out.tokens.empty() || ended_ok);
  if (echo_now) {
    echoed_ = true;
    text = job_.prompt_text + text;
  }
  OJson lp = job_.want_logprobs && (!tokens.empty() || echo_now) ? logprobs_json(tokens, echo_now)
                                                                 : OJson(nullptr);
  // return_token_ids: this output's ids ride on its first chunk (the prompt's on the first of
  // all), as logprobs do.
  OJson ids = nullptr;
  if (job_.return_token_ids && (!tokens.empty() || !ids_sent_)) {
    ids = OJson::array();
    for (const OutputToken& t : tokens) ids.push_back(t.token);
  }
  auto make = [&](OJson payload, const OJson& finish) {
    OJson choice = OJson::object();
    choice["index"] = index_;
    if (job_.chat) {
      choice["delta"] = std::move(payload);
    } else {
      choice["text"] = std::move(payload);
    }
    choice["logprobs"] = lp;
    lp = nullptr;  // logprobs ride on the first chunk of this output only
    choice["finish_reason"] = finish;
    if (job_.return_token_ids) {
      choice["token_ids"] = ids.is_null() ? OJson::array() : ids;
      if (!ids_sent_) choice["prompt_token_ids"] = job_.request.prompt;
      ids_sent_ = true;
      ids = nullptr;
    }
    OJson c = OJson::object();
    c["id"] = id_;
    c["object"] = job_.chat ? "chat.completion.chunk" : "text_completion";
    c["created"] = created_;
    c["model"] = job_.model;
    c["choices"] = OJson::array({std::move(choice)});
    chunks.push_back(dump_safe(c));
  };
  if (job_.chat) {
    for (auto& e : events) {
      OJson d = OJson::object();
      if (e.kind == AssistantEvent::Kind::kReasoning) {
        d["reasoning_content"] = e.text;
      } else if (e.kind == AssistantEvent::Kind::kContent) {
        d["content"] = e.text;
      } else if (e.kind == AssistantEvent::Kind::kToolCallBegin) {
        // The call's id and name when its invoke opens, then its arguments piece by piece.
        OJson call = OJson::object();
        call["index"] = tool_calls_sent_;
        call["id"] = call_id(tool_calls_sent_);
        call["type"] = "function";
        call["function"] = {{"name", e.call.name}, {"arguments", ""}};
        d["tool_calls"] = OJson::array({std::move(call)});
        ++tool_calls_sent_;
      } else if (e.kind == AssistantEvent::Kind::kToolCallDelta) {
        OJson call = OJson::object();
        call["index"] = tool_calls_sent_ - 1;
        call["function"] = {{"arguments", e.text}};
        d["tool_calls"] = OJson::array({std::move(call)});
      } else {
        // The call's end (or its abort) needs no chunk of its own.
        tool_calls_done_ += e.kind == AssistantEvent::Kind::kToolCall;
        continue;
      }
      make(std::move(d), nullptr);
    }
    if (!lp.is_null() || !ids.is_null()) make(OJson::object(), nullptr);
  } else if (!text.empty() || !lp.is_null() || !ids.is_null()) {
    make(text, nullptr);
  }
  if (ended_ok) make(job_.chat ? OJson::object() : OJson(""), finish_reason());
  return chunks;
}

std::string ResponseBuilder::stream_usage_chunk(int64_t completion_tokens,
                                                int64_t reasoning_tokens) const {
  OJson u = OJson::object();
  u["id"] = id_;
  u["object"] = job_.chat ? "chat.completion.chunk" : "text_completion";
  u["created"] = created_;
  u["model"] = job_.model;
  u["choices"] = OJson::array();
  u["usage"] = usage_json(completion_tokens, reasoning_tokens);
  return dump_safe(u);
}

std::string ResponseBuilder::call_id(int i) const {
  return index_ == 0 ? fmt::format("call_{}_{}", id_, i)
                     : fmt::format("call_{}_{}_{}", id_, index_, i);
}

void ResponseBuilder::add(const RequestOutput& out) {
  std::vector<AssistantEvent> events;
  absorb(out, events);
  if (!job_.score_only) tokens_.insert(tokens_.end(), out.tokens.begin(), out.tokens.end());
  if (!job_.score_only)
    for (const OutputToken& t : out.tokens) token_ids_.push_back(t.token);
  if (!job_.chat && !job_.score_only) text_ += out.text;
  for (auto& e : events) {
    if (e.kind == AssistantEvent::Kind::kReasoning) reasoning_text_ += e.text;
    if (e.kind == AssistantEvent::Kind::kContent) text_ += e.text;
    if (e.kind == AssistantEvent::Kind::kToolCall) calls_.push_back(std::move(e.call));
  }
}

OJson ResponseBuilder::choice_json() {
  OJson choice = OJson::object();
  choice["index"] = index_;
  text_offset_ = 0;  // logprobs_json advances it token by token
  if (job_.chat) {
    OJson msg = OJson::object();
    msg["role"] = "assistant";
    msg["content"] = text_.empty() && !calls_.empty() ? OJson(nullptr) : OJson(text_);
    msg["reasoning_content"] = job_.thinking ? OJson(reasoning_text_) : OJson(nullptr);
    if (!calls_.empty()) {
      OJson calls = OJson::array();
      for (std::size_t i = 0; i < calls_.size(); ++i) {
        OJson c = OJson::object();
        c["id"] = call_id(int(i));
        c["type"] = "function";
        c["function"] = {{"name", calls_[i].name}, {"arguments", calls_[i].arguments_json()}};
        calls.push_back(std::move(c));
      }
      msg["tool_calls"] = std::move(calls);
    }
    choice["message"] = std::move(msg);
  } else {
    choice["text"] = job_.echo_prompt ? job_.prompt_text + text_ : text_;
  }
  choice["logprobs"] =
      job_.want_logprobs ? logprobs_json(tokens_, job_.echo_prompt) : OJson(nullptr);
  choice["finish_reason"] = finish_reason();
  if (!job_.chat && job_.request.sampling.prompt_logprobs >= 0)
    choice["prompt_logprobs"] = prompt_logprobs_json();
  if (job_.return_token_ids) {  // vLLM's places: the prompt's ids per choice for completions
    if (!job_.chat) choice["prompt_token_ids"] = job_.request.prompt;
    choice["token_ids"] = token_ids_;
  }
  return choice;
}

std::string ResponseBuilder::build() {
  return build_response({this});
}

std::string build_response(const std::vector<ResponseBuilder*>& choices) {
  const ResponseBuilder& first = *choices.front();
  OJson r = OJson::object();
  r["id"] = first.id_;
  r["object"] = first.job_.chat ? "chat.completion" : "text_completion";
  r["created"] = first.created_;
  r["model"] = first.job_.model;
  OJson list = OJson::array();
  int64_t completion = 0, reasoning = 0;
  for (ResponseBuilder* b : choices) {
    list.push_back(b->choice_json());
    completion += b->completion_tokens();
    reasoning += b->reasoning_tokens();
  }
  r["choices"] = std::move(list);
  r["usage"] = first.usage_json(completion, reasoning);  // the prompt counted once, as OpenAI does
  if (first.job_.chat && first.job_.return_token_ids)
    r["prompt_token_ids"] = first.job_.request.prompt;  // vLLM: top level for chat
  if (first.job_.chat && first.job_.request.sampling.prompt_logprobs >= 0)
    r["prompt_logprobs"] = choices.front()->prompt_logprobs_json();  // vLLM: top level for chat
  return dump_safe(r);
}

ApiError model_not_found(const std::string& asked, const ServedModel& model) {
  ApiError e;
  e.status = 404;
  e.type = "NotFoundError";
  e.param = "model";
  e.code = "model_not_found";
  e.message =
      fmt::format("The model `{}` does not exist (this server serves `{}`).", asked, model.name);
  return e;
}

namespace {

OJson model_json(const ServedModel& model, int64_t created) {
  OJson m = OJson::object();
  m["id"] = model.name;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "dsv41";
  m["max_model_len"] = model.max_context;
  // The sampling a request starts from (--generation-config, --override-generation-config); the
  // engine's own defaults for the keys not listed.
  m["default_sampling"] = model.sampling_defaults.to_json();
  // The other server-wide defaults (issue 36 item 8), so a client sees all of them here:
  // --default-chat-template-kwargs ({} when none), --reasoning-budget (null when none), and
  // --served-model-name's names after the first (which is `id`).
  m["default_chat_template_kwargs"] = model.default_chat_template_kwargs;
  m["reasoning_budget"] = model.reasoning_budget < 0 ? OJson() : OJson(model.reasoning_budget);
  m["aliases"] = model.aliases;
  return m;
}

}  // namespace

std::string model_body(const ServedModel& model, int64_t created) {
  return dump_safe(model_json(model, created));
}

std::string models_body(const ServedModel& model, int64_t created) {
  OJson body = OJson::object();
  body["object"] = "list";
  body["data"] = OJson::array({model_json(model, created)});
  return dump_safe(body);
}

}  // namespace dsv41
