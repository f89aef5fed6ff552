// serve/openai.hpp: the OpenAI request shapes `cellshard serve` accepts
// (POST /v1/completions, POST /v1/chat/completions), checked field by field,
// and the OpenAI error body. Pure functions: no I/O, no cluster.
//
// Accepted fields (the rest of the OpenAI request is ignored, as the OpenAI
// SDKs send fields a server may not know):
//   model        string; "" or absent = the loaded model, else it must equal it (404)
//   prompt       string, or an array of exactly one string (completions)
//   messages     [{role: system|developer|user|assistant|tool, content: string |
//                 [{type: "text", text}]}] (chat; at least one)
//   max_tokens   integer >= 1 (also max_completion_tokens): tokens generated after
//                the prompt; default 16 for completions, the rest of the context for chat
//   temperature  number in [0, 2] (default 1); 0 = greedy argmax
//   top_p        number in [0, 1] (default 1 = the whole distribution)
//   seed         integer; absent, 0 or negative (llama.cpp: -1) = drawn by the server
//   stop         string or array of at most 4 non-empty strings
//   n            1 (anything else: 400)
//   stream       boolean; stream_options.include_usage boolean
//   echo         boolean (completions): the prompt as the tokenizer decodes it, then the text
// Errors: parse_request returns an api_error with status 400 naming the field
// (OpenAI's "param") and what was expected.
#pragma once

#include "model/chat.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cellshard::serve {

/// An error as OpenAI reports it: HTTP status and {"error": {message, type, param, code}}.
struct api_error {
  api_error() = default;
  api_error(int s, std::string m, std::string t = "invalid_request_error", std::string p = "", std::string c = "")
      : status(s), message(std::move(m)), type(std::move(t)), param(std::move(p)), code(std::move(c)) {}
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};
nlohmann::json error_body(const api_error& e);

struct chat_message {
  std::string role, content;
};

struct completion_request {
  bool chat = false;
  std::string model;                  // as given ("" = absent)
  std::string prompt;                 // completions
  std::vector<chat_message> messages; // chat
  std::optional<int> max_tokens;
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
};

/// Checks and converts a request body. `chat` selects the endpoint's shape.
struct parse_result {
  std::optional<completion_request> request;
  api_error error;  // when !request
};
parse_result parse_request(const std::string& body, bool chat);

/// The prompt of a chat for a model without a chat template: the messages'
/// contents joined by newlines (what `run --chat` does for such models).
std::string join_messages(const std::vector<chat_message>& messages);

/// The prompt of a chat in the model's chat format `f` (model/chat.hpp; `run
/// --chat` uses the same), ending where the assistant's answer begins; with
/// format none, the contents joined by newlines. OpenAI's "developer" role is
/// a system message and a "tool" result a user turn (the formats know system,
/// user and assistant only). Errors: none for requests parse_request accepted.
cellshard::result<cellshard::model::chat::prompt> chat_prompt(cellshard::model::chat::format f,
                                                                     const std::vector<chat_message>& messages);

/// Stop strings: the part of `text` a client may see now. Scans for the
/// earliest occurrence of any stop string in text; when found, returns its
/// offset and sets *hit. Otherwise returns the length of text minus the
/// longest suffix that is a proper prefix of a stop string (held back until
/// the next token decides).
size_t visible_length(const std::string& text, const std::vector<std::string>& stop, bool* hit);

/// UTF-8 in a stream: the largest n' <= n such that text[0, n') does not end
/// inside a multi-byte sequence (a lead byte 110xxxxx, 1110xxxx or 11110xxx,
/// RFC 3629, whose continuation bytes are not all within n). A token may
/// carry part of a character (byte-level BPE, SentencePiece byte fallback);
/// the rest is held back until the next token completes it. Bytes that can
/// never be valid are not held (the JSON writer replaces them with U+FFFD).
size_t utf8_complete_length(const std::string& text, size_t n);

/// JSON text of `j` with invalid UTF-8 in its strings replaced by U+FFFD
/// (nlohmann's default throws type_error 316: a model may well generate
/// such bytes).
std::string dump_json(const nlohmann::json& j);

}  // namespace cellshard::serve
