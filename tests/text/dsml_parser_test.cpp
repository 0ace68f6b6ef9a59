// DSML parser: round trip with the encoder (whole and in every 1..7-byte chunking), the
// reasoning/content split, truncation at every byte, malformed blocks kept as content, tool-call
// arguments streamed piece by piece and equal to the whole arguments at every split point.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "text/chat.h"
#include "text/dsml_parser.h"

namespace dsv41 {
namespace {

const std::string kEosText = "<｜end▁of▁sentence｜>";

struct Turn {
  std::string reasoning;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments JSON
};

// What the model would generate for `turn`, taken from the encoder's rendering of it as the last
// assistant turn (after the generation cue, before the EOS).
std::string generated_text(const Turn& turn, bool thinking) {
  std::vector<ChatMessage> msgs(2);
  msgs[0].role = "user";
  msgs[0].content = "q";
  msgs[1].role = "assistant";
  msgs[1].content = turn.content;
  msgs[1].reasoning = turn.reasoning;
  for (const auto& [name, args] : turn.calls) {
    ChatToolCall c;
    c.name = name;
    c.arguments = args;
    msgs[1].tool_calls.push_back(c);
  }
  ChatOptions opt;
  opt.thinking = thinking;
  opt.add_generation_prompt = false;
  auto text = encode_chat(msgs, opt);
  EXPECT_TRUE(text.is_ok());
  std::string cue = std::string("<｜Assistant｜>") + (thinking ? "<think>" : "</think>");
  std::size_t start = text->find(cue);
  EXPECT_NE(start, std::string::npos);
  std::string gen = text->substr(start + cue.size());
  EXPECT_TRUE(gen.ends_with(kEosText));
  return gen.substr(0, gen.size() - kEosText.size());
}

std::vector<Turn> sample_turns() {
  return {
      {"think first", "plain answer", {}},
      {"", "", {{"get_weather", R"({"location": "Beijing", "unit": "celsius"})"}}},
      {"r",
       "Let me check.",
       {{"f", R"({"n": 3, "xs": [1, 2.5, "a"], "o": {"k": null}, "b": false})"},
        {"g", R"({"text": "multi\nline <b>tag</b> \"quoted\""})"}}},
      {"reasoning with </thin partial", "content ending in blank lines\n\n", {{"h", "{}"}}},
      {"日本語の推論",
       "emoji 👍🏽 and é",
       {{"search", R"({"query": "naïve café", "num_results": 5})"}}},
  };
}

void expect_matches(const ParsedAssistant& p, const Turn& t, bool thinking,
                    const std::string& label) {
  EXPECT_EQ(p.reasoning, thinking ? t.reasoning : "") << label;
  EXPECT_EQ(p.content, t.content) << label;
  ASSERT_EQ(p.tool_calls.size(), t.calls.size()) << label;
  for (std::size_t i = 0; i < t.calls.size(); ++i) {
    EXPECT_EQ(p.tool_calls[i].name, t.calls[i].first) << label;
    auto expected_args = parse_json_ordered(t.calls[i].second);
    ASSERT_TRUE(expected_args.is_ok());
    EXPECT_EQ(p.tool_calls[i].arguments_json(), python_json_dumps(*expected_args)) << label;
  }
  EXPECT_FALSE(p.reasoning_unterminated) << label;
  EXPECT_FALSE(p.calls_truncated) << label;
  EXPECT_EQ(p.malformed_calls, 0) << label;
}

TEST(Dsml, RoundTripsWhatTheEncoderWrites) {
  for (bool thinking : {true, false}) {
    int k = 0;
    for (const Turn& t : sample_turns()) {
      std::string gen = generated_text(t, thinking);
      expect_matches(parse_assistant_text(gen, thinking), t, thinking,
                     "turn " + std::to_string(k++));
    }
  }
}

TEST(Dsml, StreamingInAnyChunkingGivesTheSameResult) {
  for (bool thinking : {true, false}) {
    for (const Turn& t : sample_turns()) {
      std::string gen = generated_text(t, thinking);
      for (std::size_t chunk = 1; chunk <= 7; ++chunk) {
        AssistantStreamParser parser(thinking);
        std::vector<AssistantEvent> events;
        ParsedAssistant p;
        for (std::size_t i = 0; i < gen.size(); i += chunk) {
          events.clear();
          parser.feed(std::string_view(gen).substr(i, chunk), events);
          for (auto& e : events) {
            if (e.kind == AssistantEvent::Kind::kReasoning) p.reasoning += e.text;
            if (e.kind == AssistantEvent::Kind::kContent) p.content += e.text;
            if (e.kind == AssistantEvent::Kind::kToolCall) p.tool_calls.push_back(e.call);
          }
        }
        events.clear();
        parser.finish(events);
        for (auto& e : events) {
          if (e.kind == AssistantEvent::Kind::kReasoning) p.reasoning += e.text;
          if (e.kind == AssistantEvent::Kind::kContent) p.content += e.text;
          if (e.kind == AssistantEvent::Kind::kToolCall) p.tool_calls.push_back(e.call);
        }
        expect_matches(p, t, thinking, "chunk " + std::to_string(chunk));
      }
    }
  }
}

TEST(Dsml, StreamsDeltasEarly) {
  AssistantStreamParser parser(true);
  std::vector<AssistantEvent> ev;
  parser.feed("abc</th", ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "abc");  // "</th" is held: it may begin </think>
  ev.clear();
  parser.feed("ink>Hello\n", ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, AssistantEvent::Kind::kContent);
  EXPECT_EQ(ev[0].text, "Hello");  // "\n" held: it may begin "\n\n<｜DSML｜ calls>"
  ev.clear();
  parser.feed("world", ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "\nworld");
}

TEST(Dsml, TruncationAtEveryByteNeverLosesCompletedParts) {
  Turn t{"why", "text", {{"a", R"({"x": 1})"}, {"b", R"({"y": "z"})"}}};
  std::string gen = generated_text(t, true);
  for (std::size_t cut = 0; cut <= gen.size(); ++cut) {
    ParsedAssistant p = parse_assistant_text(gen.substr(0, cut), true);
    std::size_t think_end = gen.find("</think>");
    if (cut < think_end + 8) {
      EXPECT_TRUE(p.reasoning_unterminated) << cut;
      EXPECT_EQ(gen.substr(0, cut).rfind(p.reasoning, 0), 0u) << cut;  // a prefix of the reasoning
      EXPECT_TRUE(p.tool_calls.empty());
    } else {
      EXPECT_EQ(p.reasoning, "why") << cut;
    }
    EXPECT_EQ(p.malformed_calls, 0) << cut;
    EXPECT_LE(p.tool_calls.size(), 2u);
    for (const auto& c : p.tool_calls) EXPECT_TRUE(c.name == "a" || c.name == "b");
    if (cut == gen.size()) EXPECT_EQ(p.tool_calls.size(), 2u);
    const std::string open = "<｜DSML｜ calls>";
    if (gen.find(open) + open.size() <= cut && cut < gen.size())
      EXPECT_TRUE(p.calls_truncated) << cut;
    if (cut < gen.find(open) + open.size()) EXPECT_FALSE(p.calls_truncated) << cut;
  }
}

TEST(Dsml, MalformedCallsAreKeptAsContent) {
  std::string bad_invoke = "<｜DSML｜ invoke name=\"f\">\nnot a parameter\n</｜DSML｜ invoke>";
  ParsedAssistant p =
      parse_assistant_text("hi\n\n<｜DSML｜ calls>\n" + bad_invoke + "\n</｜DSML｜ calls>", false);
  EXPECT_EQ(p.malformed_calls, 1);
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_EQ(p.content, "hi" + bad_invoke);
  ParsedAssistant q = parse_assistant_text("<｜DSML｜ calls>\ngarbage", false);
  EXPECT_EQ(q.malformed_calls, 1);
  EXPECT_EQ(q.content, "\ngarbage");  // handed back as written
  // string="false" with invalid JSON keeps the raw text as a string value.
  ParsedAssistant r = parse_assistant_text(
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"n\" "
      "string=\"false\">{oops</｜DSML｜ "
      "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      false);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments_json(), R"({"n": "{oops"})");
  // Tool-call extraction off: the block is plain content.
  ParsedAssistant off = parse_assistant_text("r</think>a\n\n<｜DSML｜ calls>\nx", true, false);
  EXPECT_EQ(off.reasoning, "r");
  EXPECT_EQ(off.content, "a\n\n<｜DSML｜ calls>\nx");
  // No thinking close in thinking mode: all reasoning, flagged.
  ParsedAssistant s = parse_assistant_text("still thinking", true);
  EXPECT_EQ(s.reasoning, "still thinking");
  EXPECT_TRUE(s.reasoning_unterminated);
  EXPECT_EQ(s.content, "");
}

// A model that skips </think> and opens the calls block inside its reasoning (the failure other
// V4.1 servers report as tool calls lost at high effort): the block still ends the reasoning and
// its calls come back, in every chunking; without tools declared it stays reasoning text.
TEST(Dsml, CallsBlockInsideTheReasoningStillGivesTheCalls) {
  const Turn call_turn{"", "", {{"get_weather", R"({"location": "Paris"})"}}};
  std::string block =
      generated_text(call_turn, false);  // "\n\n<｜DSML｜ calls>...</｜DSML｜ calls>"
  ASSERT_EQ(block.rfind("\n\n<｜DSML｜ calls>", 0), 0u) << block;
  const std::string gen = "I will look it up." + block;
  for (std::size_t chunk = 1; chunk <= 9; ++chunk) {
    AssistantStreamParser parser(true);
    std::vector<AssistantEvent> events;
    for (std::size_t i = 0; i < gen.size(); i += chunk)
      parser.feed(std::string_view(gen).substr(i, chunk), events);
    parser.finish(events);
    std::string reasoning, content;
    std::vector<DsmlToolCall> calls;
    for (auto& e : events) {
      if (e.kind == AssistantEvent::Kind::kReasoning) reasoning += e.text;
      if (e.kind == AssistantEvent::Kind::kContent) content += e.text;
      if (e.kind == AssistantEvent::Kind::kToolCall) calls.push_back(e.call);
    }
    EXPECT_EQ(reasoning, "I will look it up.") << "chunk " << chunk;
    EXPECT_EQ(content, "") << "chunk " << chunk;
    ASSERT_EQ(calls.size(), 1u) << "chunk " << chunk;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments["location"], "Paris");
    EXPECT_EQ(parser.unclosed_reasoning_calls(), 1);
    EXPECT_FALSE(parser.reasoning_unterminated());
  }
  AssistantStreamParser no_tools(true, false);
  std::vector<AssistantEvent> events;
  no_tools.feed(gen, events);
  no_tools.finish(events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, AssistantEvent::Kind::kReasoning);
  EXPECT_EQ(events[0].text, gen);
}

// Reasoning that only mentions the calls tag stays reasoning (and what follows its </think> is
// content); a real block opened in the reasoning and followed by the model's late </think> gives
// its call, and the late marker is not content. Every chunking.
TEST(Dsml, CallsTagInTheReasoningThatOpensNoCallStaysReasoning) {
  const Turn call_turn{"", "", {{"get_weather", R"({"location": "Paris"})"}}};
  const std::string block = generated_text(call_turn, false);
  const std::string tag = "<｜DSML｜ calls>";
  struct Case {
    std::string gen, reasoning, content;
    std::size_t calls;
  };
  const std::vector<Case> cases = {
      {"I could write " + tag + " here, but no.</think>Answer.",
       "I could write " + tag + " here, but no.", "Answer.", 0},
      {"Mention\n\n" + tag +
           "\n<｜DSML｜ invoke name=\"x\">oops</｜DSML｜ invoke> done.</think>Fine.",
       "Mention\n\n" + tag + "\n<｜DSML｜ invoke name=\"x\">oops</｜DSML｜ invoke> done.", "Fine.",
       0},
      {"Plan." + block + "\n</think>\n", "Plan.", "\n", 1},
      {"Unfinished " + tag, "Unfinished " + tag, "", 0},
  };
  for (const Case& c : cases)
    for (std::size_t chunk = 1; chunk <= 9; ++chunk) {
      AssistantStreamParser parser(true);
      std::vector<AssistantEvent> events;
      for (std::size_t i = 0; i < c.gen.size(); i += chunk)
        parser.feed(std::string_view(c.gen).substr(i, chunk), events);
      parser.finish(events);
      std::string reasoning, content;
      std::size_t calls = 0;
      for (auto& e : events) {
        if (e.kind == AssistantEvent::Kind::kReasoning) reasoning += e.text;
        if (e.kind == AssistantEvent::Kind::kContent) content += e.text;
        calls += e.kind == AssistantEvent::Kind::kToolCall;
      }
      EXPECT_EQ(reasoning, c.reasoning) << c.gen << " chunk " << chunk;
      EXPECT_EQ(content, c.content) << c.gen << " chunk " << chunk;
      EXPECT_EQ(calls, c.calls) << c.gen << " chunk " << chunk;
      EXPECT_EQ(parser.unclosed_reasoning_calls(), int(c.calls)) << c.gen;
      EXPECT_EQ(parser.malformed_calls(), 0) << c.gen;
    }
}

// Found by fuzz_dsml_stream (tests/fuzz/regressions/dsml_stream): a malformed calls block followed
// by a real one. The malformed text used to be handed back with everything buffered after it, so
// a later block was parsed or not depending on how the text was chunked; now the text after the
// malformed part is content again whatever the chunking, and the later block gives its call.
TEST(Dsml, MalformedBlockThenARealOneGivesTheSameInEveryChunking) {
  const Turn call_turn{"", "", {{"f", R"({"a": 1})"}}};
  const std::string block = generated_text(call_turn, false);
  const std::string gen = "Text.\n\n<｜DSML｜ calls>\n<｜DSML｜ junk here" + block;
  const ParsedAssistant whole = parse_assistant_text(gen, false);
  ASSERT_EQ(whole.tool_calls.size(), 1u) << whole.content;
  EXPECT_EQ(whole.malformed_calls, 1);
  for (std::size_t chunk = 1; chunk <= 11; ++chunk) {
    AssistantStreamParser parser(false);
    std::vector<AssistantEvent> events;
    for (std::size_t i = 0; i < gen.size(); i += chunk)
      parser.feed(std::string_view(gen).substr(i, chunk), events);
    parser.finish(events);
    std::string content;
    std::size_t calls = 0;
    for (auto& e : events) {
      if (e.kind == AssistantEvent::Kind::kContent) content += e.text;
      calls += e.kind == AssistantEvent::Kind::kToolCall;
    }
    EXPECT_EQ(content, whole.content) << "chunk " << chunk;
    EXPECT_EQ(calls, 1u) << "chunk " << chunk;
  }
}

// A stream's tool calls as a client sees them: per call its name, the concatenated argument pieces
// and how many pieces came; the complete calls; the aborted ones. It owns the (non-thinking) parser
// the test feeds, and takes the events after each piece.
struct StreamedCalls {
  AssistantStreamParser parser{false};
  std::vector<std::string> names, texts;
  std::vector<int> pieces;
  std::vector<DsmlToolCall> calls;
  int aborts = 0;
  std::string content;

  void feed(std::string_view text) {
    parser.feed(text, events_);
    take();
  }
  void feed_bytes(std::string_view text) {
    for (char c : text) feed(std::string_view(&c, 1));
  }
  void finish() {
    parser.finish(events_);
    take();
  }

 private:
  std::vector<AssistantEvent> events_;
  void take() {
    for (auto& e : events_) {
      switch (e.kind) {
        case AssistantEvent::Kind::kToolCallBegin:
          names.push_back(e.call.name);
          texts.emplace_back();
          pieces.push_back(0);
          break;
        case AssistantEvent::Kind::kToolCallDelta:
          EXPECT_FALSE(texts.empty());
          if (texts.empty()) break;
          texts.back() += e.text;
          ++pieces.back();
          break;
        case AssistantEvent::Kind::kToolCall:
          calls.push_back(e.call);
          break;
        case AssistantEvent::Kind::kToolCallAbort:
          ++aborts;
          break;
        case AssistantEvent::Kind::kContent:
          content += e.text;
          break;
        default:
          break;
      }
    }
    events_.clear();
  }
};

// A long string argument needing every kind of escaping (quotes, backslashes, newlines, tabs, a
// control byte, multi-byte UTF-8 that a byte split cuts) and string="false" values of each JSON
// type, nested.
Turn streaming_turn() {
  std::string text = "line \"one\"\\ \ttab\nnaïve café 日本語 👍🏽 \x01 ";
  for (int i = 0; i < 6; ++i) text += text.substr(0, 17) + "</｜DSML｜ param";  // tag look-alikes
  OJson args = OJson::object();
  args["path"] = "src/a.txt";
  args["content"] = text;
  args["n"] = 3;
  args["x"] = 2.5e-7;
  args["o"] = OJson::parse(R"({"k": [1, null, true, "s\"q"], "e": {}})");
  args["empty"] = "";
  return {"", "", {{"write_file", python_json_dumps(args)}, {"noargs", "{}"}}};
}

TEST(Dsml, ToolArgumentsStreamPieceByPieceAndConcatenateToTheWholeArguments) {
  const Turn turn = streaming_turn();
  const std::string gen = generated_text(turn, false);
  const ParsedAssistant whole = parse_assistant_text(gen, false);
  expect_matches(whole, turn, false, "whole");
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  // Every split point in two, then byte by byte.
  for (std::size_t split = 0; split <= gen.size() + 1; ++split) {
    StreamedCalls s;
    if (split <= gen.size()) {
      s.feed(std::string_view(gen).substr(0, split));
      s.feed(std::string_view(gen).substr(split));
    } else {
      s.feed_bytes(gen);
    }
    s.finish();
    const std::string label = "split " + std::to_string(split);
    ASSERT_EQ(s.calls.size(), 2u) << label;
    ASSERT_EQ(s.names.size(), 2u) << label;
    EXPECT_EQ(s.aborts, 0) << label;
    EXPECT_EQ(s.content, "") << label;
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(s.names[i], whole.tool_calls[i].name) << label;
      EXPECT_EQ(s.texts[i], whole.tool_calls[i].arguments_json()) << label << " call " << i;
      EXPECT_EQ(s.calls[i].arguments_json(), s.texts[i]) << label;
      EXPECT_EQ(s.calls[i].arguments, whole.tool_calls[i].arguments) << label;
    }
    if (split > gen.size())  // byte by byte: the long argument came in many pieces
      EXPECT_GT(s.pieces[0], 50) << "pieces: " << s.pieces[0];
  }
}

TEST(Dsml, ToolArgumentsStreamBeforeTheInvokeCloses) {
  const std::string head =
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"w\">\n<｜DSML｜ parameter name=\"n\" "
      "string=\"false\">{ \"a\" :  1.50 }</｜DSML｜ parameter>\n<｜DSML｜ parameter "
      "name=\"text\" string=\"true\">say \"hi\"</｜DSML｜ par";
  StreamedCalls s;
  s.feed(head);
  ASSERT_EQ(s.names, std::vector<std::string>{"w"});
  // The raw JSON value re-serialised when it closed; the string's text so far, the look-alike of
  // the closing tag held back.
  EXPECT_EQ(s.texts[0], R"({"n": {"a": 1.5}, "text": "say \"hi\")");
  EXPECT_TRUE(s.calls.empty());
  s.feed("se>x</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  s.finish();
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.texts[0], R"({"n": {"a": 1.5}, "text": "say \"hi\"</｜DSML｜ parse>x"})");
  EXPECT_EQ(s.calls[0].arguments_json(), s.texts[0]);
}

// A call that began streaming and is then cut or proves malformed: the stream is told (abort),
// and what follows is what the whole-text parse gives (nothing for a cut; the text as content
// for a malformed one).
TEST(Dsml, ToolCallCutOrMalformedAfterItBeganIsAborted) {
  const std::string open =
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"w\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"true\">abc</｜DSML｜ parameter>\n";
  {
    StreamedCalls s;
    s.feed(open);
    s.finish();
    EXPECT_EQ(s.names.size(), 1u);
    EXPECT_EQ(s.aborts, 1);
    EXPECT_TRUE(s.calls.empty());
    EXPECT_TRUE(s.parser.calls_truncated());
  }
  {
    const std::string gen = open + "junk</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    StreamedCalls s;
    s.feed_bytes(gen);
    s.finish();
    EXPECT_EQ(s.aborts, 1);
    EXPECT_TRUE(s.calls.empty());
    EXPECT_EQ(s.content, parse_assistant_text(gen, false).content);
    EXPECT_EQ(s.parser.malformed_calls(), 1);
  }
}

// Arbitrary chunkings (1-24 bytes: the markers split anywhere, the multi-byte ones inside their
// characters): a malformed invoke first (its pieces may go out before it proves malformed, then
// its abort), the sample's calls, then a call with a repeated parameter. In every chunking each
// complete call's streamed pieces concatenate to its arguments, and the calls and the content are
// those of the one-shot parse.
TEST(Dsml, ToolArgumentsStreamTheSameInAnyChunking) {
  const std::string param = "<｜DSML｜ parameter name=\"";
  const std::string param_close = "</｜DSML｜ parameter>\n";
  std::string gen = generated_text(streaming_turn(), false);
  const std::string calls_open = "<｜DSML｜ calls>\n";
  const std::size_t at = gen.find(calls_open);
  ASSERT_NE(at, std::string::npos);
  gen.insert(at + calls_open.size(), "<｜DSML｜ invoke name=\"bad\">\n" + param +
                                         "a\" string=\"true\">x" + param_close +
                                         "oops</｜DSML｜ invoke>\n");
  const std::string calls_close = "</｜DSML｜ calls>";
  const std::size_t end = gen.rfind(calls_close);
  ASSERT_NE(end, std::string::npos);
  gen.insert(end, "<｜DSML｜ invoke name=\"dup\">\n" + param + "k\" string=\"true\">one" +
                      param_close + param + "k\" string=\"false\">[2]" + param_close +
                      "</｜DSML｜ invoke>\n");
  const ParsedAssistant whole = parse_assistant_text(gen, false);
  ASSERT_EQ(whole.tool_calls.size(), 3u);
  EXPECT_EQ(whole.malformed_calls, 1);
  EXPECT_EQ(whole.tool_calls[2].arguments_json(), R"({"k": "one", "k": [2]})");
  EXPECT_EQ(python_json_dumps(whole.tool_calls[2].arguments), R"({"k": [2]})");
  Rng rng(36);
  for (int trial = 0; trial < 300; ++trial) {
    AssistantStreamParser parser(false);
    std::vector<AssistantEvent> events;
    std::vector<DsmlToolCall> calls;
    std::string content, open_text;
    bool open = false;
    int pieces = 0;
    auto take = [&] {
      for (auto& e : events) {
        switch (e.kind) {
          case AssistantEvent::Kind::kToolCallBegin:
            EXPECT_FALSE(open);
            open = true;
            open_text.clear();
            break;
          case AssistantEvent::Kind::kToolCallDelta:
            EXPECT_TRUE(open);
            open_text += e.text;
            ++pieces;
            break;
          case AssistantEvent::Kind::kToolCall:
            EXPECT_TRUE(open);
            EXPECT_EQ(open_text, e.call.arguments_json()) << "trial " << trial;
            open = false;
            calls.push_back(e.call);
            break;
          case AssistantEvent::Kind::kToolCallAbort:
            EXPECT_TRUE(open);
            // The malformed call's pieces: all that was decided before it proved malformed.
            EXPECT_EQ(open_text, R"({"a": "x")") << "trial " << trial;
            open = false;
            break;
          case AssistantEvent::Kind::kContent:
            EXPECT_FALSE(open);
            content += e.text;
            break;
          default:
            break;
        }
      }
      events.clear();
    };
    for (std::size_t i = 0; i < gen.size();) {
      const std::size_t n = trial == 0 ? 1 : 1 + rng.below(24);
      parser.feed(std::string_view(gen).substr(i, n), events);
      i += n;
      take();
    }
    parser.finish(events);
    take();
    const std::string label = "trial " + std::to_string(trial);
    EXPECT_FALSE(open) << label;
    EXPECT_EQ(content, whole.content) << label;
    EXPECT_EQ(parser.malformed_calls(), 1) << label;
    ASSERT_EQ(calls.size(), 3u) << label;
    for (std::size_t c = 0; c < 3; ++c) {
      EXPECT_EQ(calls[c].name, whole.tool_calls[c].name) << label;
      EXPECT_EQ(calls[c].arguments_json(), whole.tool_calls[c].arguments_json()) << label;
      EXPECT_EQ(calls[c].arguments, whole.tool_calls[c].arguments) << label;
    }
    if (trial == 0) EXPECT_GT(pieces, 100);  // byte by byte: the long argument in many pieces
  }
}

// parallel_tool_calls false: the second call sends nothing at all.
TEST(Dsml, SingleCallDropsTheLaterCallsEvents) {
  const Turn t{"", "", {{"a", R"({"x": 1})"}, {"b", R"({"y": "z"})"}}};
  const std::string gen = generated_text(t, false);
  StreamedCalls s;
  s.parser.set_single_call(true);
  s.feed(gen);
  s.finish();
  EXPECT_EQ(s.names, std::vector<std::string>{"a"});
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.texts[0], R"({"x": 1})");
}

}  // namespace
}  // namespace dsv41
