#include "serve/openai.hpp"

#include <cmath>
#include <limits>

namespace cellshard::serve {

nlohmann::json error_body(const api_error& e) {
  nlohmann::json j;
  j["error"]["message"] = e.message;
  j["error"]["type"] = e.type;
  j["error"]["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  j["error"]["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return j;
}

namespace {

struct bad_field {
  std::string param, message;
};

double number(const nlohmann::json& j, const char* name, double lo, double hi) {
  if (!j.is_number()) throw bad_field{name, std::string(name) + ": expected a number, got " + j.dump()};
  const double v = j.get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    throw bad_field{name, std::string(name) + ": " + j.dump() + " is outside [" + nlohmann::json(lo).dump() + ", " +
                              nlohmann::json(hi).dump() + "]"};
  return v;
}

int64_t integer(const nlohmann::json& j, const char* name) {
  if (!j.is_number_integer())
    throw bad_field{name, std::string(name) + ": expected an integer, got " + j.dump()};
  return j.get<int64_t>();
}

bool boolean(const nlohmann::json& j, const char* name) {
  if (!j.is_boolean()) throw bad_field{name, std::string(name) + ": expected true or false, got " + j.dump()};
  return j.get<bool>();
}

std::string content_of(const nlohmann::json& c, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (size_t k = 0; k < c.size(); ++k) {
      const auto& part = c[k];
      if (!part.is_object() || part.value("type", std::string()) != "text" || !part.contains("text") ||
          !part["text"].is_string())
        throw bad_field{where, where + "[" + std::to_string(k) +
                                   "]: expected {\"type\": \"text\", \"text\": string} (only text parts are supported)"};
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw bad_field{where, where + ": expected a string or an array of text parts"};
}

}  // namespace

parse_result parse_request(const std::string& body, bool chat) {
  parse_result out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const std::exception& e) {
    out.error = {400, std::string("the body is not valid JSON: ") + e.what()};
    return out;
  }
  if (!j.is_object()) {
    out.error = {400, "the body must be a JSON object, got " + std::string(j.type_name())};
    return out;
  }
  completion_request r;
  r.chat = chat;
  try {
    if (j.contains("model") && !j["model"].is_null()) {
      if (!j["model"].is_string()) throw bad_field{"model", "model: expected a string"};
      r.model = j["model"].get<std::string>();
    }
    if (chat) {
      if (!j.contains("messages")) throw bad_field{"messages", "messages: required"};
      const auto& m = j["messages"];
      if (!m.is_array() || m.empty()) throw bad_field{"messages", "messages: expected a non-empty array"};
      for (size_t i = 0; i < m.size(); ++i) {
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m[i].is_object() || !m[i].contains("role") || !m[i]["role"].is_string())
          throw bad_field{where, where + ": expected an object with a string role"};
        const std::string role = m[i]["role"].get<std::string>();
        if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
          throw bad_field{where + ".role", where + ".role: '" + role +
                                               "' is not one of system, developer, user, assistant, tool"};
        r.messages.push_back({role, content_of(m[i].value("content", nlohmann::json()), i)});
      }
    } else {
      if (!j.contains("prompt")) throw bad_field{"prompt", "prompt: required"};
      const auto& p = j["prompt"];
      if (p.is_string()) {
        r.prompt = p.get<std::string>();
      } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        r.prompt = p[0].get<std::string>();
      } else {
        throw bad_field{"prompt", "prompt: expected a string or an array of one string (several prompts, "
                                  "and token arrays, are not supported)"};
      }
    }
    for (const char* key : {"max_tokens", "max_completion_tokens"})
      if (j.contains(key) && !j[key].is_null()) {
        const int64_t v = integer(j[key], key);
        if (v < 1 || v > std::numeric_limits<int>::max())
          throw bad_field{key, std::string(key) + ": " + std::to_string(v) + " is not a positive integer"};
        r.max_tokens = static_cast<int>(v);
      }
    if (j.contains("temperature") && !j["temperature"].is_null())
      r.temperature = static_cast<float>(number(j["temperature"], "temperature", 0, 2));
    if (j.contains("top_p") && !j["top_p"].is_null()) r.top_p = static_cast<float>(number(j["top_p"], "top_p", 0, 1));
    if (j.contains("seed") && !j["seed"].is_null()) {
      const auto& s = j["seed"];
      // 0 and negative values (llama.cpp's server takes -1 as "random") mean no seed: the
      // server draws one, as without the field (a negative value was wrapped to 2^64-1 before).
      if (s.is_number_unsigned()) r.seed = s.get<uint64_t>();
      else if (const int64_t v = integer(s, "seed"); v > 0) r.seed = static_cast<uint64_t>(v);
      if (r.seed && *r.seed == 0) r.seed.reset();
    }
    if (j.contains("n") && !j["n"].is_null()) {
      const int64_t n = integer(j["n"], "n");
      if (n != 1) throw bad_field{"n", "n: only 1 choice per request is supported, got " + std::to_string(n)};
    }
    // Log probabilities are not computed: a client that asks for them would get
    // "logprobs": null where it expects numbers, so the request is refused.
    if (j.contains("logprobs") && !j["logprobs"].is_null() &&
        !(j["logprobs"].is_boolean() && !j["logprobs"].get<bool>()))
      throw bad_field{"logprobs", "logprobs: not supported (no log probabilities are computed); leave it out, "
                                  "or send null or false"};
    if (j.contains("top_logprobs") && !j["top_logprobs"].is_null())
      throw bad_field{"top_logprobs", "top_logprobs: not supported (no log probabilities are computed); leave it out"};
    if (j.contains("stop") && !j["stop"].is_null()) {
      const auto& s = j["stop"];
      if (s.is_string()) {
        r.stop.push_back(s.get<std::string>());
      } else if (s.is_array() && s.size() <= 4) {
        for (const auto& e : s) {
          if (!e.is_string()) throw bad_field{"stop", "stop: expected strings"};
          r.stop.push_back(e.get<std::string>());
        }
      } else {
        throw bad_field{"stop", "stop: expected a string or an array of at most 4 strings"};
      }
      for (const auto& e : r.stop)
        if (e.empty()) throw bad_field{"stop", "stop: an empty string would stop before the first token"};
    }
    if (j.contains("stream") && !j["stream"].is_null()) r.stream = boolean(j["stream"], "stream");
    if (j.contains("stream_options") && !j["stream_options"].is_null()) {
      const auto& so = j["stream_options"];
      if (!so.is_object()) throw bad_field{"stream_options", "stream_options: expected an object"};
      if (!r.stream) throw bad_field{"stream_options", "stream_options: only allowed with stream: true"};
      if (so.contains("include_usage")) r.include_usage = boolean(so["include_usage"], "stream_options.include_usage");
    }
    if (!chat && j.contains("echo") && !j["echo"].is_null()) r.echo = boolean(j["echo"], "echo");
  } catch (const bad_field& b) {
    out.error = {400, b.message, "invalid_request_error", b.param};
    return out;
  }
  out.request = std::move(r);
  return out;
}

std::string join_messages(const std::vector<chat_message>& messages) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) out += (i ? "\n" : "") + messages[i].content;
  return out;
}

cellshard::result<cellshard::model::chat::prompt> chat_prompt(cellshard::model::chat::format f,
                                                                     const std::vector<chat_message>& messages) {
  std::vector<cellshard::model::chat::message> msgs;
  msgs.reserve(messages.size());
  for (const auto& m : messages) {
    const std::string role = m.role == "developer" ? "system" : m.role == "tool" ? "user" : m.role;
    msgs.push_back({role, m.content});
  }
  return cellshard::model::chat::apply(f, msgs);
}

size_t visible_length(const std::string& text, const std::vector<std::string>& stop, bool* hit) {
  *hit = false;
  size_t first = std::string::npos;
  for (const auto& s : stop) {
    const size_t at = text.find(s);
    if (at != std::string::npos && (first == std::string::npos || at < first)) first = at;
  }
  if (first != std::string::npos) {
    *hit = true;
    return first;
  }
  size_t hold = 0;
  for (const auto& s : stop)
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len)
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  return text.size() - hold;
}

size_t utf8_complete_length(const std::string& text, size_t n) {
  n = std::min(n, text.size());
  // Walk back over at most 3 continuation bytes to the sequence's lead byte.
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(text[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = 1;
    if ((b & 0xE0) == 0xC0)
      need = 2;
    else if ((b & 0xF0) == 0xE0)
      need = 3;
    else if ((b & 0xF8) == 0xF0)
      need = 4;
    return need > back ? n - back : n;
  }
  return n;  // only continuation bytes (or none): nothing to wait for
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace cellshard::serve
