// serve/openai.hpp and serve/metrics.hpp without a server: the request
// checks (each field's error names the field), stop-string visibility and
// the Prometheus histogram's cumulative buckets.
#include "serve/metrics.hpp"
#include "serve/openai.hpp"

#include <catch2/catch.hpp>

using namespace cellshard::serve;

TEST_CASE("serve parse_request: a completion with every field", "[serve][unit]") {
  auto p = parse_request(R"({"model":"stories260K","prompt":"Once","max_tokens":5,"temperature":0.5,
                              "top_p":0.25,"seed":7,"stop":["\n","."],"n":1,"stream":true,
                              "stream_options":{"include_usage":true},"echo":true,"user":"x"})",
                         false);
  REQUIRE(p.request);
  const auto& r = *p.request;
  CHECK(r.model == "stories260K");
  CHECK(r.prompt == "Once");
  CHECK(*r.max_tokens == 5);
  CHECK(r.temperature == 0.5f);
  CHECK(r.top_p == 0.25f);
  CHECK(*r.seed == 7);
  CHECK(r.stop == std::vector<std::string>{"\n", "."});
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.echo);
}

TEST_CASE("serve parse_request: logprobs null or false is no request for them", "[serve][unit]") {
  CHECK(parse_request(R"({"prompt":"a","logprobs":null})", false).request);
  CHECK(parse_request(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":null})", true)
            .request);
}

TEST_CASE("serve parse_request: chat messages, defaults", "[serve][unit]") {
  auto p = parse_request(R"({"messages":[{"role":"system","content":"Be brief."},
                              {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"!"}]}]})",
                         true);
  REQUIRE(p.request);
  CHECK(p.request->messages.size() == 2);
  CHECK(join_messages(p.request->messages) == "Be brief.\nHi!");
  CHECK(!p.request->max_tokens);
  CHECK(p.request->temperature == 1.0f);
  CHECK(p.request->top_p == 1.0f);
  CHECK(!p.request->seed);
  CHECK(!p.request->stream);
}

TEST_CASE("serve chat_prompt: the model's chat format, as run --chat lays it out", "[serve][unit]") {
  // A Llama 3 GGUF's chat completion is its header-token layout, not the
  // contents joined (issue #22: "chat uses the model's chat format").
  const std::vector<chat_message> m = {{"system", "Be brief."}, {"user", "Hi"}};
  auto p = chat_prompt(cellshard::model::chat::format::llama3, m);
  REQUIRE(p.ok());
  CHECK(p->text ==
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(p->add_bos);
  // No template: the contents joined by newlines.
  p = chat_prompt(cellshard::model::chat::format::none, m);
  REQUIRE(p.ok());
  CHECK(p->text == "Be brief.\nHi");
  // OpenAI's newer roles: developer is a system message, a tool result a user turn.
  p = chat_prompt(cellshard::model::chat::format::chatml,
                  {{"developer", "D"}, {"user", "U"}, {"assistant", "A"}, {"tool", "T"}});
  REQUIRE(p.ok());
  CHECK(p->text ==
        "<|im_start|>system\nD<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>user\nT<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("serve parse_request: each bad field is a 400 naming it", "[serve][unit]") {
  struct row {
    const char* body;
    bool chat;
    const char* param;
  };
  const row rows[] = {
      {R"({"prompt":"a","temperature":"hot"})", false, "temperature"},
      {R"({"prompt":"a","temperature":2.5})", false, "temperature"},
      {R"({"prompt":"a","top_p":-0.1})", false, "top_p"},
      {R"({"prompt":"a","max_tokens":0})", false, "max_tokens"},
      {R"({"prompt":"a","max_tokens":1.5})", false, "max_tokens"},
      {R"({"prompt":"a","n":2})", false, "n"},
      {R"({"prompt":"a","stop":["a","b","c","d","e"]})", false, "stop"},
      {R"({"prompt":"a","stop":""})", false, "stop"},
      {R"({"prompt":"a","stream":"yes"})", false, "stream"},
      {R"({"prompt":"a","stream_options":{"include_usage":true}})", false, "stream_options"},
      {R"({"prompt":[1,2,3]})", false, "prompt"},
      {R"({"max_tokens":3})", false, "prompt"},
      {R"({"messages":[]})", true, "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", true, "messages[0].role"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true, "messages[0].content"},
      {R"({"prompt":"a","model":3})", false, "model"},
      // logprobs used to be accepted and answered with "logprobs": null.
      {R"({"prompt":"a","logprobs":2})", false, "logprobs"},
      {R"({"prompt":"a","logprobs":0})", false, "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", true, "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", true, "top_logprobs"},
  };
  for (const auto& r : rows) {
    INFO(r.body);
    auto p = parse_request(r.body, r.chat);
    REQUIRE(!p.request);
    CHECK(p.error.status == 400);
    CHECK(p.error.param == r.param);
    const auto j = error_body(p.error);
    CHECK(j["error"]["type"] == "invalid_request_error");
    CHECK(j["error"]["param"] == r.param);
  }
  auto bad = parse_request("{not json", false);
  REQUIRE(!bad.request);
  CHECK(bad.error.status == 400);
  CHECK(error_body(bad.error)["error"]["param"].is_null());
  CHECK(!parse_request("[1]", false).request);
}

TEST_CASE("serve visible_length: stop strings cut the text and hold back a possible start", "[serve][unit]") {
  bool hit = false;
  CHECK(visible_length("abc", {}, &hit) == 3);
  CHECK(!hit);
  CHECK(visible_length("Once upon. a", {"."}, &hit) == 9);
  CHECK(hit);
  // "up" may begin "upon": held back until the next piece decides.
  CHECK(visible_length("Once up", {"upon"}, &hit) == 5);
  CHECK(!hit);
  CHECK(visible_length("Once upon", {"upon"}, &hit) == 5);
  CHECK(hit);
  // The earliest of several stops wins.
  CHECK(visible_length("a.b\nc", {"\n", "."}, &hit) == 1);
  CHECK(hit);
}

TEST_CASE("serve histogram: cumulative buckets, sum and count in the Prometheus text format", "[serve][unit]") {
  histogram h({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0}) h.observe(v);
  const std::string t = h.render("cellshard_x_seconds", "help text");
  CHECK(t.find("# TYPE cellshard_x_seconds histogram\n") != std::string::npos);
  CHECK(t.find("cellshard_x_seconds_bucket{le=\"0.1\"} 2\n") != std::string::npos);  // 0.05 and 0.1 (le is <=)
  CHECK(t.find("cellshard_x_seconds_bucket{le=\"1\"} 3\n") != std::string::npos);
  CHECK(t.find("cellshard_x_seconds_bucket{le=\"10\"} 4\n") != std::string::npos);
  CHECK(t.find("cellshard_x_seconds_bucket{le=\"+Inf\"} 5\n") != std::string::npos);
  CHECK(t.find("cellshard_x_seconds_sum 22.65\n") != std::string::npos);
  CHECK(t.find("cellshard_x_seconds_count 5\n") != std::string::npos);
  CHECK(exponential_buckets(0.001, 2, 3) == std::vector<double>{0.001, 0.002, 0.004});
}

TEST_CASE("serve utf8_complete_length: a character split over tokens is held back, bytes that cannot complete are not", "[serve][unit]") {
  const std::string e_acute = "\xC3\xA9";            // U+00E9, 2 bytes
  const std::string kanji = "\xE6\x97\xA5";          // U+65E5, 3 bytes
  const std::string emoji = "\xF0\x9F\x98\x80";      // U+1F600, 4 bytes
  CHECK(utf8_complete_length("abc", 3) == 3);
  CHECK(utf8_complete_length("ab" + e_acute, 4) == 4);
  CHECK(utf8_complete_length("ab" + e_acute.substr(0, 1), 3) == 2);
  CHECK(utf8_complete_length("a" + kanji.substr(0, 2), 3) == 1);
  CHECK(utf8_complete_length("a" + kanji, 4) == 4);
  for (size_t k = 1; k < 4; ++k) CHECK(utf8_complete_length("x" + emoji.substr(0, k), 1 + k) == 1);
  CHECK(utf8_complete_length("x" + emoji, 5) == 5);
  // n below the size: only text[0, n) counts.
  CHECK(utf8_complete_length("a" + kanji + "b", 3) == 1);
  // A stray continuation byte or an invalid lead byte never completes: not held.
  CHECK(utf8_complete_length("a\x80", 2) == 2);
  CHECK(utf8_complete_length("a\xFF", 2) == 2);
  CHECK(utf8_complete_length("", 0) == 0);
}

TEST_CASE("serve dump_json: invalid UTF-8 from a model becomes U+FFFD instead of an exception", "[serve][unit]") {
  nlohmann::json j;
  j["text"] = std::string("ok \xE6\x97");  // a character cut off at the end of a generation
  CHECK(dump_json(j) == "{\"text\":\"ok \xEF\xBF\xBD\"}");
  CHECK_THROWS(j.dump());  // what the server did before (type_error 316, a dead stream)
}

TEST_CASE("serve parse_request: seed 0 or negative means the server draws one", "[serve][unit]") {
  for (const char* body : {R"({"prompt":"a","seed":0})", R"({"prompt":"a","seed":-1})", R"({"prompt":"a","seed":-7})"}) {
    INFO(body);
    const auto p = parse_request(body, false);
    REQUIRE(p.request);
    CHECK(!p.request->seed);
  }
  const auto big = parse_request(R"({"prompt":"a","seed":18446744073709551615})", false);
  REQUIRE(big.request);
  REQUIRE(big.request->seed);
  CHECK(*big.request->seed == 18446744073709551615ull);
  const auto five = parse_request(R"({"prompt":"a","seed":5})", false);
  REQUIRE(five.request);
  CHECK(five.request->seed == std::optional<uint64_t>(5));
  const auto frac = parse_request(R"({"prompt":"a","seed":1.5})", false);
  CHECK(!frac.request);
  CHECK(frac.error.status == 400);
}
