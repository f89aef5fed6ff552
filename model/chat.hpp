// model/chat.hpp: chat prompt formats. A list of {role, content} messages
// becomes one prompt text for the tokenizer (which then matches the formats'
// special tokens whole and adds BOS when the model adds one).
//
// Formats (the layouts the model families were trained on):
//  - llama2:  "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]", an answer
//             as " {assistant} </s><s>[INST] {user} [/INST]" (Llama 2 chat)
//  - llama3:  "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
//             per message, then the assistant header (Llama 3 instruct)
//  - chatml:  "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
//             "<|im_start|>assistant\n" (Qwen, many fine-tunes)
//  - zephyr:  "<|{role}|>\n{content}</s>\n" per message, then "<|assistant|>\n"
//  - none:    the contents joined by "\n" (models without a chat template,
//             e.g. the stories models)
// detect() recognises a GGUF tokenizer.chat_template (a Jinja text) by each
// family's distinctive markers; it does not run the template.
// Pure functions; thread-safe. Errors: parse_format names the accepted names.
#pragma once

#include "model/result.hpp"

#include <string>
#include <vector>

namespace cellshard::model::chat {

struct message {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

enum class format { none, llama2, llama3, chatml, zephyr };

/// "none", "llama2", "llama3", "chatml", "zephyr".
const char* to_string(format f);
/// The inverse of to_string; error lists the names.
result<format> parse_format(const std::string& name);
/// The format a chat template (tokenizer.chat_template) is written for, by
/// markers: <|start_header_id|> -> llama3, <|im_start|> -> chatml, [INST] ->
/// llama2, <|user|> -> zephyr; none for anything else (or "").
format detect(const std::string& chat_template);

/// The format of chats with the model at `model_path`: `name` when not empty
/// (parse_format), else the one its GGUF tokenizer.chat_template names
/// (detect), else none (llama2.c files, GGUFs without a template). Errors: an
/// unknown name; a GGUF that cannot be read (naming the file).
result<format> format_for(const std::string& name, const std::string& model_path);

struct prompt {
  std::string text;      // to encode with special tokens parsed
  bool add_bos = true;   // BOS first when the tokenizer adds one (no format writes it itself)
};

/// The prompt for `messages` in format `f`, ending where the assistant's next
/// answer begins (the generation prompt). Errors: a role other than system,
/// user or assistant (naming the message index), no messages.
result<prompt> apply(format f, const std::vector<message>& messages);

}  // namespace cellshard::model::chat
