#include "model/chat.hpp"

#include "model/bundle.hpp"
#include "model/gguf.hpp"

namespace cellshard::model::chat {

const char* to_string(format f) {
  switch (f) {
    case format::none: return "none";
    case format::llama2: return "llama2";
    case format::llama3: return "llama3";
    case format::chatml: return "chatml";
    case format::zephyr: return "zephyr";
  }
  return "?";
}

result<format> parse_format(const std::string& name) {
  for (format f : {format::none, format::llama2, format::llama3, format::chatml, format::zephyr})
    if (name == to_string(f)) return f;
  return make_error("chat format '" + name + "' is not known, expected one of: llama2, llama3, chatml, zephyr, none");
}

format detect(const std::string& t) {
  auto has = [&](const char* s) { return t.find(s) != std::string::npos; };
  if (has("<|start_header_id|>")) return format::llama3;
  if (has("<|im_start|>")) return format::chatml;
  if (has("[INST]")) return format::llama2;
  if (has("<|user|>")) return format::zephyr;
  return format::none;
}

result<prompt> apply(format f, const std::vector<message>& messages) {
  if (messages.empty()) return make_error("chat: no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      return make_error("chat: message " + std::to_string(i) + " has role '" + r +
                        "', expected system, user or assistant");
  }
  prompt p;
  std::string& out = p.text;
  switch (f) {
    case format::none:
      for (size_t i = 0; i < messages.size(); ++i) out += (i ? "\n" : "") + messages[i].content;
      break;
    case format::llama2: {
      // The system text goes inside the first [INST] block.
      std::string system;
      bool open = false;  // inside "[INST] ..." waiting for the user text
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += m.content;
        } else if (m.role == "user") {
          out += "[INST] ";
          if (!system.empty()) {
            out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
            system.clear();
          }
          out += m.content + " [/INST]";
          open = true;
        } else {
          out += " " + m.content + " </s><s>";
          open = false;
        }
      }
      if (!system.empty() && !open) out += "[INST] <<SYS>>\n" + system + "\n<</SYS>>\n\n [/INST]";
      break;
    }
    case format::llama3:
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case format::chatml:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    case format::zephyr:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
      out += "<|assistant|>\n";
      break;
  }
  return p;
}

result<format> format_for(const std::string& name, const std::string& model_path) {
  if (!name.empty()) return parse_format(name);
  if (model_path.empty() || !is_gguf_path(model_path)) return format::none;
  auto g = gguf::file::open(model_path);
  if (!g) return g.err();
  if (!(*g)->has("tokenizer.chat_template")) return format::none;
  auto t = (*g)->get_string("tokenizer.chat_template");
  if (!t) return t.err();
  return detect(*t);
}

}  // namespace cellshard::model::chat
