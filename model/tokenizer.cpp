#include "model/tokenizer.hpp"

#include "model/gguf.hpp"

#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <xxhash.h>

namespace cellshard::model {

result<std::shared_ptr<const tokenizer>> tokenizer::open(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot open tokenizer file: " + std::strerror(errno));
  // A GGUF file (a whole model, possibly gigabytes) is mapped, not read.
  uint8_t magic[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(magic), 4);
  if (in.gcount() == 4 && gguf::file::has_magic(magic, 4)) {
    auto f = gguf::file::open(path);
    if (!f) return f.err();
    return from_gguf(**f);
  }
  in.clear();
  in.seekg(0);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto t = from_bytes(bytes, path);
  if (!t && gguf::file::named_gguf(path))  // a name that says GGUF: its error first
    return make_error(gguf::file::bad_magic(path, bytes.data(), bytes.size()) +
                      " (as a llama2.c tokenizer: " + t.message() + ")");
  return t;
}

result<std::shared_ptr<const tokenizer>> tokenizer::from_bytes(const std::vector<uint8_t>& b,
                                                               const std::string& name) {
  auto t = std::make_shared<tokenizer>();
  t->name_ = name;
  // tokenizer.bin is little-endian like the checkpoints; read it portably.
  auto rd32 = [&](size_t off) {
    return static_cast<uint32_t>(b[off]) | static_cast<uint32_t>(b[off + 1]) << 8 |
           static_cast<uint32_t>(b[off + 2]) << 16 | static_cast<uint32_t>(b[off + 3]) << 24;
  };
  if (b.size() < 4)
    return make_error(name + ": tokenizer file is " + std::to_string(b.size()) +
                      " bytes, too short for its max_token_length field");
  t->max_token_length_ = static_cast<int32_t>(rd32(0));
  if (t->max_token_length_ <= 0 || t->max_token_length_ > 1024)
    return make_error(name + ": field max_token_length is " +
                      std::to_string(t->max_token_length_) + ", expected 1..1024");
  size_t off = 4;
  while (off < b.size()) {
    const int id = static_cast<int>(t->vocab_.size());
    if (off + 8 > b.size())
      return make_error(name + ": token " + std::to_string(id) + " at byte " +
                        std::to_string(off) + ": record header truncated");
    float score;
    uint32_t sbits = rd32(off);
    std::memcpy(&score, &sbits, 4);
    const int32_t len = static_cast<int32_t>(rd32(off + 4));
    off += 8;
    if (len < 0 || len > t->max_token_length_ || off + static_cast<size_t>(len) > b.size())
      return make_error(name + ": token " + std::to_string(id) + ": field length is " +
                        std::to_string(len) + ", expected 0.." +
                        std::to_string(t->max_token_length_) + " within the file");
    t->vocab_.emplace_back(reinterpret_cast<const char*>(b.data() + off), len);
    t->scores_.push_back(score);
    off += len;
  }
  if (t->vocab_.size() < 3)
    return make_error(name + ": tokenizer has " + std::to_string(t->vocab_.size()) +
                      " tokens, expected at least <unk>, <s>, </s>");
  // run.c looks pieces up with bsearch over the strcmp-sorted vocabulary; the
  // files hold no duplicate pieces, so a hash map answers the same. Pieces are
  // compared as C strings there, so key on the text up to any NUL.
  for (int i = 0; i < t->vocab_size(); ++i)
    t->index_.emplace(std::string(t->vocab_[i].c_str()), i);
  t->digest_ = XXH64(b.data(), b.size(), 0);
  return std::shared_ptr<const tokenizer>(std::move(t));
}

std::shared_ptr<const tokenizer> tokenizer::byte_level(int vocab_size) {
  auto t = std::make_shared<tokenizer>();
  t->name_ = "built-in byte-level tokenizer";
  t->max_token_length_ = 8;
  t->vocab_ = {"<unk>", "<s>", "</s>"};
  char buf[8];
  for (int i = 0; i < 256; ++i) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", i);
    t->vocab_.emplace_back(buf);
  }
  t->vocab_.emplace_back(" ");
  // The rest: syllables with and without a leading space, so that a random
  // model's output reads as pseudo-words rather than placeholders.
  const std::string consonants = "bcdfghjklmnprstvwyz", vowels = "aeiou";
  for (int with_space = 1; with_space >= 0; --with_space)
    for (char c : consonants)
      for (char v : vowels) {
        if (t->vocab_size() >= vocab_size) break;
        t->vocab_.push_back(std::string(with_space ? " " : "") + c + v);
      }
  for (int i = t->vocab_size(); i < vocab_size; ++i) {
    std::snprintf(buf, sizeof buf, "<x%d>", i);
    t->vocab_.emplace_back(buf);
  }
  t->scores_.assign(t->vocab_.size(), 0.0f);
  for (int i = 0; i < t->vocab_size(); ++i) t->index_.emplace(t->vocab_[i], i);
  auto bytes = t->to_bytes();
  t->digest_ = XXH64(bytes.data(), bytes.size(), 0);
  return t;
}

std::vector<uint8_t> tokenizer::to_bytes() const {
  std::vector<uint8_t> out;
  auto wr32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  wr32(static_cast<uint32_t>(max_token_length_));
  for (int i = 0; i < vocab_size(); ++i) {
    uint32_t s;
    std::memcpy(&s, &scores_[i], 4);
    wr32(s);
    wr32(static_cast<uint32_t>(vocab_[i].size()));
    out.insert(out.end(), vocab_[i].begin(), vocab_[i].end());
  }
  return out;
}

int tokenizer::lookup(const std::string& s) const {
  auto it = index_.find(s);
  return it == index_.end() ? -1 : it->second;
}

std::vector<int> tokenizer::encode_llama2c(const std::string& text, bool bos, bool eos) const {
  std::vector<int> tokens;
  if (bos) tokens.push_back(bos_id);
  if (!text.empty()) {
    const int space = lookup(" ");  // run.c assumes " " exists; skip it if not
    if (space != -1) tokens.push_back(space);
  }
  // Split into UTF-8 code points (at most 4 bytes each, as run.c); a code
  // point in the vocabulary becomes its id, otherwise each byte falls back to
  // its <0xXX> token (id = byte + 3).
  std::string buf;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) buf.clear();
    buf.push_back(static_cast<char>(c));
    const unsigned char next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((next & 0xC0) == 0x80 && buf.size() < 4) continue;
    const int id = lookup(buf);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      // A vocabulary without that byte piece (fewer than 259 tokens) gets
      // <unk> (0) instead of an id past its end (run.c indexes past it).
      for (unsigned char b : buf) tokens.push_back(static_cast<int>(b) + 3 < vocab_size() ? static_cast<int>(b) + 3 : 0);
    }
    buf.clear();
  }
  // Greedy merges: the adjacent pair whose concatenation has the best score.
  std::string merged;
  while (true) {
    float best_score = -1e10f;
    int best_id = -1;
    int best_idx = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      if (tokens[i] >= vocab_size() || tokens[i + 1] >= vocab_size()) continue;  // BOS/EOS of a tiny vocabulary
      merged = std::string(vocab_[tokens[i]].c_str()) + vocab_[tokens[i + 1]].c_str();
      const int id = lookup(merged);
      if (id != -1 && scores_[id] > best_score) {
        best_score = scores_[id];
        best_id = id;
        best_idx = static_cast<int>(i);
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  if (eos) tokens.push_back(eos_id);
  return tokens;
}

std::string tokenizer::decode_llama2c(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return {};
  const char* piece = vocab_[token].c_str();
  if (prev == bos_id && piece[0] == ' ') ++piece;
  // run.c: sscanf(piece, "<0x%02hhX>", &byte) maps raw byte pieces to the byte.
  unsigned char byte_val;
  if (std::sscanf(piece, "<0x%02hhX>", &byte_val) == 1) {
    // safe_printf prints a single byte only when printable or whitespace.
    if (!(std::isprint(byte_val) || std::isspace(byte_val))) return {};
    return std::string(1, static_cast<char>(byte_val));
  }
  if (piece[0] == '\0') return {};
  if (piece[1] == '\0') {
    const unsigned char b = static_cast<unsigned char>(piece[0]);
    if (!(std::isprint(b) || std::isspace(b))) return {};
  }
  return std::string(piece);
}

}  // namespace cellshard::model
