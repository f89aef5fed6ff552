// The GGUF tokenizer kinds (spm, bpe) of model/tokenizer.hpp: construction
// from plain data, special-token partition, SentencePiece merging, byte-level
// BPE with ICU-based pre-tokenizer regexes, decoding. Behaviour follows
// llama.cpp's llama-vocab (facts: priorities, tie-breaks, defaults, the
// pre-tokenizer expressions); the code is this project's own.
#include "model/tokenizer.hpp"

#include "model/gguf.hpp"
#include "base/parse.hpp"

#ifndef CELLSHARD_NO_ICU
#include <unicode/regex.h>
#include <unicode/unistr.h>
#endif
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <queue>

namespace cellshard::model {

namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible space.
const std::string spm_space = "\xE2\x96\x81";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

/// Length of the UTF-8 sequence a lead byte announces (1 for stray bytes).
size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes ('!'..'~',
/// U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves, the other 68 bytes
/// get U+0100 upwards in byte order.
struct byte_map {
  std::string enc[256];                      // byte -> UTF-8 of its code point
  std::unordered_map<uint32_t, uint8_t> dec; // code point -> byte
  byte_map() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = self ? static_cast<uint32_t>(b) : next++;
      append_utf8(enc[b], cp);
      dec[cp] = static_cast<uint8_t>(b);
    }
  }
};
const byte_map& bytes_table() {
  static const byte_map m;
  return m;
}

// Pre-tokenizer expressions (llama.cpp's, for the pre-tokenizer names below).
// \s and \S are rewritten to Unicode's White_Space property before compiling,
// the set llama.cpp's own splitter uses (ICU's \s omits U+000B and U+0085).
const char* const llama3_regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::vector<std::string> default_regexes = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

// Qwen2's (llama.cpp's QWEN2 pre-tokenizer type): Llama 3's pattern with
// digits one by one (\p{N}) instead of in groups of up to three.
const char* const qwen2_regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// GPT-2's own pattern (llama.cpp's GPT2 type): the second of the default set alone.
const char* const gpt2_regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

bool is_llama3_pre(const std::string& pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "falcon3";
}
// tokenizer.ggml.pre names llama.cpp maps to its QWEN2 and GPT2 types.
bool is_qwen2_pre(const std::string& pre) {
  return pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "megrez";
}
bool is_gpt2_pre(const std::string& pre) {
  for (const char* p : {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es",
                        "jina-v2-de", "jina-v2-code", "roberta-bpe"})
    if (pre == p) return true;
  return false;
}

#ifndef CELLSHARD_NO_ICU
std::string icu_pattern(std::string re) {
  replace_all(re, "\\s", "\\p{White_Space}");
  replace_all(re, "\\S", "\\P{White_Space}");
  return re;
}

}  // namespace

/// Compiled pre-tokenizer patterns; RegexPattern is immutable and safe to
/// share between threads (each call makes its own matcher).
struct compiled_regexes {
  std::vector<std::unique_ptr<icu::RegexPattern>> patterns;
};

namespace {
std::mutex regex_cache_mutex;
std::map<std::vector<std::string>, std::shared_ptr<const compiled_regexes>>& regex_cache() {
  static std::map<std::vector<std::string>, std::shared_ptr<const compiled_regexes>> m;
  return m;
}

result<std::shared_ptr<const compiled_regexes>> compile(const std::vector<std::string>& res) {
  std::lock_guard<std::mutex> lock(regex_cache_mutex);
  auto it = regex_cache().find(res);
  if (it != regex_cache().end()) return it->second;
  auto c = std::make_shared<compiled_regexes>();
  for (const auto& re : res) {
    UErrorCode st = U_ZERO_ERROR;
    UParseError pe;
    std::unique_ptr<icu::RegexPattern> p(
        icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern(re)), 0, pe, st));
    if (U_FAILURE(st) || !p)
      return make_error("pre-tokenizer expression '" + re + "' does not compile with ICU: " +
                        u_errorName(st));
    c->patterns.push_back(std::move(p));
  }
  std::shared_ptr<const compiled_regexes> out = c;
  regex_cache()[res] = out;
  return out;
}

/// Splits `text` by each pattern in turn: matches and the text between them
/// both become pieces, each piece is split independently by the next pattern.
std::vector<std::string> regex_split(const std::string& text, const compiled_regexes& re) {
  std::vector<icu::UnicodeString> chunks{icu::UnicodeString::fromUTF8(text)};
  for (const auto& p : re.patterns) {
    std::vector<icu::UnicodeString> next;
    for (const auto& chunk : chunks) {
      UErrorCode st = U_ZERO_ERROR;
      std::unique_ptr<icu::RegexMatcher> m(p->matcher(chunk, st));
      int32_t pos = 0;
      while (U_SUCCESS(st) && m->find()) {
        const int32_t s = m->start(st), e = m->end(st);
        if (s > pos) next.emplace_back(chunk, pos, s - pos);
        if (e > s) next.emplace_back(chunk, s, e - s);
        pos = e;
      }
      if (pos < chunk.length()) next.emplace_back(chunk, pos, chunk.length() - pos);
    }
    chunks = std::move(next);
  }
  std::vector<std::string> out;
  out.reserve(chunks.size());
  for (const auto& c : chunks) {
    std::string s;
    c.toUTF8String(s);
    out.push_back(std::move(s));
  }
  return out;
}

#else  // a build without ICU (CMake CELLSHARD_ICU=OFF: the powerpc64 cross build)

}  // namespace

struct compiled_regexes {};

namespace {
result<std::shared_ptr<const compiled_regexes>> compile(const std::vector<std::string>& res) {
  if (res.empty()) return std::make_shared<const compiled_regexes>();
  return make_error("pre-tokenizer expression '" + res.front() +
                    "' needs ICU, and this build has none (configured with CELLSHARD_ICU=OFF)");
}

std::vector<std::string> regex_split(const std::string& text, const compiled_regexes&) { return {text}; }
#endif

/// A symbol of the merge loops: a byte range of the word, linked to its
/// neighbours; n == 0 once merged into its left neighbour.
struct symbol {
  int prev, next;
  size_t off, n;
};

}  // namespace

vocab_spec vocab_spec::defaults_for(tokenizer_kind kind, const std::string& pre) {
  vocab_spec s;
  s.kind = kind;
  s.pre = pre;
  if (kind == tokenizer_kind::spm) {
    s.bos = 1;
    s.eos = 2;
    s.unk = 0;
    s.add_bos = true;
    s.add_space_prefix = true;
  } else {
    s.bos = 11;
    s.eos = 11;
    s.add_bos = is_llama3_pre(pre);
  }
  return s;
}

result<std::shared_ptr<const tokenizer>> tokenizer::from_vocab(vocab_spec spec) {
  const std::string& nm = spec.name;
  if (spec.kind == tokenizer_kind::llama2c)
    return make_error(nm + ": from_vocab builds GGUF tokenizers (spm, bpe), not llama2.c ones");
  const size_t n = spec.tokens.size();
  if (n == 0) return make_error(nm + ": key tokenizer.ggml.tokens is empty, expected the vocabulary");
  if (!spec.scores.empty() && spec.scores.size() != n)
    return make_error(nm + ": key tokenizer.ggml.scores has " + std::to_string(spec.scores.size()) +
                      " entries, expected one per token (" + std::to_string(n) + ")");
  if (!spec.types.empty() && spec.types.size() != n)
    return make_error(nm + ": key tokenizer.ggml.token_type has " + std::to_string(spec.types.size()) +
                      " entries, expected one per token (" + std::to_string(n) + ")");
  auto check_id = [&](int id, const char* key) -> result<void> {
    if (id < -1 || id >= static_cast<int>(n))
      return make_error(nm + ": key " + key + " is " + std::to_string(id) + ", expected a token id below " +
                        std::to_string(n));
    return {};
  };
  for (auto [id, key] : {std::pair<int, const char*>{spec.bos, "tokenizer.ggml.bos_token_id"},
                         {spec.eos, "tokenizer.ggml.eos_token_id"},
                         {spec.unk, "tokenizer.ggml.unknown_token_id"},
                         {spec.eot, "tokenizer.ggml.eot_token_id"},
                         {spec.eom, "tokenizer.ggml.eom_token_id"},
                         {spec.pad, "tokenizer.ggml.padding_token_id"}}) {
    auto ok = check_id(id, key);
    if (!ok) return ok.err();
  }
  if (spec.add_bos && spec.bos < 0)
    return make_error(nm + ": the vocabulary adds BOS (tokenizer.ggml.add_bos_token) but has no BOS id");

  auto t = std::make_shared<tokenizer>();
  t->kind_ = spec.kind;
  t->name_ = nm;
  t->vocab_ = std::move(spec.tokens);
  t->scores_ = spec.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(spec.scores);
  t->types_ = spec.types.empty() ? std::vector<int32_t>(n, static_cast<int32_t>(token_type::normal))
                                 : std::move(spec.types);
  for (size_t i = 0; i < n; ++i) {
    // An empty piece could never be matched; llama.cpp renames it likewise.
    if (t->vocab_[i].empty()) t->vocab_[i] = "[EMPTY_" + std::to_string(i) + "]";
    t->index_[t->vocab_[i]] = static_cast<int>(i);  // a repeated piece: the last id wins
    t->max_token_length_ = std::max(t->max_token_length_, static_cast<int>(t->vocab_[i].size()));
  }
  t->bos_ = spec.bos;
  t->eos_ = spec.eos;
  t->unk_ = spec.unk;
  t->add_bos_ = spec.add_bos;
  t->add_eos_ = spec.add_eos && spec.eos >= 0;
  t->add_space_prefix_ = spec.add_space_prefix;
  t->pre_ = spec.pre;

  if (spec.kind == tokenizer_kind::bpe) {
    if (spec.pre.empty() || spec.pre == "default") {
      t->regexes_ = default_regexes;
    } else if (is_llama3_pre(spec.pre)) {
      t->regexes_ = {llama3_regex};
      t->ignore_merges_ = true;
    } else if (is_qwen2_pre(spec.pre)) {
      t->regexes_ = {qwen2_regex};
    } else if (is_gpt2_pre(spec.pre)) {
      t->regexes_ = {gpt2_regex};
    } else {
      return make_error(nm + ": key tokenizer.ggml.pre is '" + spec.pre +
                        "', expected one of the supported pre-tokenizers: default, llama-bpe "
                        "(also llama3, llama-v3, falcon3), qwen2 (also deepseek-r1-qwen, megrez), "
                        "gpt-2 (also phi-2, roberta-bpe, gigachat, jina-es, jina-de, jina-v1-en, "
                        "jina-v2-es, jina-v2-de, jina-v2-code)");
    }
    auto re = compile(t->regexes_);
    if (!re) return make_error(nm + ": " + re.message());
    t->compiled_ = *re;
    for (size_t i = 0; i < spec.merges.size(); ++i) {
      const std::string& m = spec.merges[i];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos)
        return make_error(nm + ": key tokenizer.ggml.merges entry " + std::to_string(i) + " is '" + m +
                          "', expected two pieces separated by a space");
      t->ranks_.emplace(std::make_pair(m.substr(0, sp), m.substr(sp + 1)), static_cast<int>(i));
    }
  } else {
    t->byte_ids_.assign(256, -1);
    char buf[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      int id = t->lookup(buf);
      if (id < 0) id = t->lookup(std::string(1, static_cast<char>(b)));
      t->byte_ids_[b] = id;
    }
  }

  // End of generation: EOS, EOT, EOM and the tokens llama.cpp recognises by name.
  static const char* const eot_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                          "<|endoftext|>", "<EOT>",
                                          "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"};
  int eot = spec.eot, eom = spec.eom;
  if (eot < 0)
    for (const char* name : eot_names) {
      const int id = t->lookup(name);
      if (id >= 0) { eot = id; break; }
    }
  if (eom < 0) eom = t->lookup("<|eom_id|>");
  t->eot_ = eot;
  std::vector<int> eog;
  for (const char* name : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                           "<|eom_id|>", "<EOT>"}) {
    const int id = t->lookup(name);
    if (id >= 0) eog.push_back(id);
  }
  for (int id : {t->eos_, eot, eom})
    if (id >= 0) eog.push_back(id);
  for (int id : eog)  // llama.cpp treats these as control tokens whatever the file says
    t->types_[id] = static_cast<int32_t>(token_type::control);
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  t->eog_ = std::move(eog);

  // Tokens matched whole in text: control, user-defined and unknown, longest first.
  for (int i = 0; i < static_cast<int>(n); ++i) {
    const auto ty = static_cast<token_type>(t->types_[i]);
    if (ty == token_type::control || ty == token_type::user_defined || ty == token_type::unknown)
      t->specials_.push_back(i);
  }
  std::stable_sort(t->specials_.begin(), t->specials_.end(), [&](int a, int b) {
    return t->vocab_[a].size() > t->vocab_[b].size();
  });

  // Digest: every field that changes encoding or decoding.
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  auto put = [&](const void* p, size_t len) { XXH64_update(st, p, len); };
  auto put_u64 = [&](uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    put(b, 8);
  };
  auto put_str = [&](const std::string& s) { put_u64(s.size()); put(s.data(), s.size()); };
  put_u64(static_cast<uint64_t>(t->kind_));
  put_u64(n);
  for (size_t i = 0; i < n; ++i) {
    put_str(t->vocab_[i]);
    uint32_t bits;
    std::memcpy(&bits, &t->scores_[i], 4);
    put_u64(bits);
    put_u64(static_cast<uint64_t>(t->types_[i]));
  }
  put_u64(spec.merges.size());
  for (const auto& m : spec.merges) put_str(m);
  put_str(t->pre_);
  for (int v : {t->bos_, t->eos_, t->unk_, eot, eom, spec.pad, int(t->add_bos_), int(t->add_eos_),
                int(t->add_space_prefix_)})
    put_u64(static_cast<uint64_t>(static_cast<int64_t>(v)));
  t->digest_ = XXH64_digest(st);
  XXH64_freeState(st);
  return std::shared_ptr<const tokenizer>(std::move(t));
}

int tokenizer::byte_token(unsigned char b) const {
  const int id = byte_ids_.empty() ? -1 : byte_ids_[b];
  return id >= 0 ? id : unk_;
}

void tokenizer::spm_segment(const std::string& text, std::vector<int>& out) const {
  if (text.empty()) return;
  std::vector<symbol> sym;
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
    off += len;
  }
  struct bigram {
    int left, right;
    float score;
    size_t size;
  };
  // Best score first; on equal scores the leftmost pair.
  auto worse = [](const bigram& a, const bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<bigram, std::vector<bigram>, decltype(worse)> queue(worse);
  std::unordered_map<std::string, std::pair<int, int>> undo;  // merged text -> its two halves
  auto try_pair = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    std::string s = text.substr(sym[l].off, sym[l].n + sym[r].n);
    const int id = lookup(s);
    if (id < 0) return;
    queue.push({l, r, scores_[id], s.size()});
    undo[s] = {l, r};
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_pair(i - 1, i);
  while (!queue.empty()) {
    const bigram b = queue.top();
    queue.pop();
    symbol& l = sym[b.left];
    symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_pair(l.prev, b.left);
    try_pair(b.left, l.next);
  }
  // Emit each final symbol: its piece, or split back along the recorded
  // merge, or its bytes.
  std::vector<int> stack;
  for (int i = 0; i != -1; i = sym[i].next) {
    stack.push_back(i);
    while (!stack.empty()) {
      const int k = stack.back();
      stack.pop_back();
      const std::string s = text.substr(sym[k].off, sym[k].n);
      const int id = lookup(s);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      auto u = undo.find(s);
      if (u == undo.end()) {
        for (unsigned char c : s) out.push_back(byte_token(c));
        continue;
      }
      stack.push_back(u->second.second);
      stack.push_back(u->second.first);
    }
  }
}

void tokenizer::bpe_segment(const std::string& text, std::vector<int>& out) const {
  const auto& bm = bytes_table();
  for (const std::string& raw : regex_split(text, *compiled_)) {
    std::string word;
    for (unsigned char c : raw) word += bm.enc[c];
    if (ignore_merges_) {
      const int id = lookup(word);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    std::vector<symbol> sym;
    for (size_t off = 0; off < word.size();) {
      const size_t len = std::min(utf8_len(static_cast<unsigned char>(word[off])), word.size() - off);
      const int idx = static_cast<int>(sym.size());
      sym.push_back({idx - 1, off + len == word.size() ? -1 : idx + 1, off, len});
      off += len;
    }
    struct bigram {
      int left, right, rank;
      std::string text;
    };
    // Lowest rank first; on equal ranks the leftmost pair.
    auto worse = [](const bigram& a, const bigram& b) {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    };
    std::priority_queue<bigram, std::vector<bigram>, decltype(worse)> queue(worse);
    auto try_pair = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      std::string a = word.substr(sym[l].off, sym[l].n), b = word.substr(sym[r].off, sym[r].n);
      auto it = ranks_.find({a, b});
      if (it == ranks_.end()) return;
      queue.push({l, r, it->second, a + b});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_pair(i - 1, i);
    while (!queue.empty()) {
      const bigram b = queue.top();
      queue.pop();
      symbol& l = sym[b.left];
      symbol& r = sym[b.right];
      if (l.n == 0 || r.n == 0) continue;
      if (word.compare(l.off, l.n + r.n, b.text) != 0 || l.n + r.n != b.text.size()) continue;  // stale
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = b.left;
      try_pair(l.prev, b.left);
      try_pair(b.left, l.next);
    }
    for (const auto& s : sym) {
      if (s.n == 0) continue;
      const std::string piece = word.substr(s.off, s.n);
      const int id = lookup(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // No piece: each byte that is a piece on its own (llama.cpp drops the rest).
      for (char c : piece) {
        const int bid = lookup(std::string(1, c));
        if (bid >= 0) out.push_back(bid);
      }
    }
  }
}

std::vector<int> tokenizer::encode(const std::string& text, bool bos, bool eos, bool parse_special) const {
  if (kind_ == tokenizer_kind::llama2c) return encode_llama2c(text, bos, eos);
  // Partition the text into raw fragments and whole special tokens.
  struct fragment {
    int token;          // -1 = raw text
    size_t off, len;
  };
  std::vector<fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  for (int id : specials_) {
    if (!parse_special && static_cast<token_type>(types_[id]) != token_type::user_defined) continue;
    const std::string& sp = vocab_[id];
    std::vector<fragment> next;
    for (const auto& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.off;
      const size_t end = f.off + f.len;
      while (pos < end) {
        const size_t hit = text.find(sp, pos);
        if (hit == std::string::npos || hit + sp.size() > end) break;
        if (hit > pos) next.push_back({-1, pos, hit - pos});
        next.push_back({id, 0, 0});
        pos = hit + sp.size();
      }
      if (pos < end) next.push_back({-1, pos, end - pos});
    }
    frags = std::move(next);
  }
  std::vector<int> out;
  if (bos && add_bos_) out.push_back(bos_);
  bool prev_special = true;
  for (const auto& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string piece = text.substr(f.off, f.len);
    if (kind_ == tokenizer_kind::spm) {
      if (add_space_prefix_ && prev_special) piece.insert(piece.begin(), ' ');
      replace_all(piece, " ", spm_space);
      spm_segment(piece, out);
    } else {
      bpe_segment(piece, out);
    }
    prev_special = false;
  }
  if (eos && add_eos_) out.push_back(eos_);
  return out;
}

std::string tokenizer::decode(int prev, int token, bool special) const {
  if (kind_ == tokenizer_kind::llama2c) return decode_llama2c(prev, token);
  if (token < 0 || token >= vocab_size()) return {};
  const auto ty = static_cast<token_type>(types_[token]);
  const std::string& text = vocab_[token];
  if (ty == token_type::control || ty == token_type::unknown) return special ? text : std::string();
  if (ty == token_type::user_defined) return text;
  std::string out;
  if (kind_ == tokenizer_kind::spm) {
    if (ty == token_type::byte) {
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        if (auto b = parse_uint<unsigned char>(std::string_view(text).substr(3, 2), 16))  // base/parse.hpp
          return std::string(1, static_cast<char>(*b));
      }
      return {};
    }
    if (ty != token_type::normal) return {};
    out = text;
    replace_all(out, spm_space, " ");
    if (prev == bos_ && add_space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }
  if (ty != token_type::normal) return {};
  const auto& bm = bytes_table();
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
    uint32_t cp = static_cast<unsigned char>(text[off]);
    if (len > 1) {
      cp &= 0xFF >> (len + 1);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[off + k]) & 0x3F);
    }
    auto it = bm.dec.find(cp);
    if (it != bm.dec.end()) out += static_cast<char>(it->second);
    off += len;
  }
  return out;
}

token_type tokenizer::type(int id) const {
  if (types_.empty()) return token_type::normal;
  return static_cast<token_type>(types_[id]);
}

bool tokenizer::is_stop(int token) const {
  if (kind_ == tokenizer_kind::llama2c) return token == bos_;
  return std::binary_search(eog_.begin(), eog_.end(), token);
}

std::vector<int> tokenizer::stop_ids() const {
  if (kind_ == tokenizer_kind::llama2c) return {bos_};
  return eog_;
}

int tokenizer::special_id(const std::string& text) const {
  const int id = lookup(text);
  if (id < 0 || types_.empty()) return -1;
  const auto ty = static_cast<token_type>(types_[id]);
  return ty == token_type::control || ty == token_type::user_defined ? id : -1;
}

std::string tokenizer::kind_name() const {
  switch (kind_) {
    case tokenizer_kind::llama2c: return "llama2.c";
    case tokenizer_kind::spm: return "llama (SentencePiece)";
    case tokenizer_kind::bpe:
      return "gpt2 (byte-level BPE, pre " + (pre_.empty() ? std::string("default") : pre_) + ")";
  }
  return "?";
}

}  // namespace cellshard::model

namespace cellshard::model {

result<std::shared_ptr<const tokenizer>> tokenizer::from_gguf(const gguf::file& f) {
  const std::string& nm = f.path();
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return model.err();
  tokenizer_kind kind;
  if (*model == "llama") {
    kind = tokenizer_kind::spm;
  } else if (*model == "gpt2") {
    kind = tokenizer_kind::bpe;
  } else {
    return make_error(nm + ": key tokenizer.ggml.model is '" + *model +
                      "', expected a supported tokenizer: llama (SentencePiece) or gpt2 (byte-level BPE)");
  }
  std::string pre;
  if (f.has("tokenizer.ggml.pre")) {
    auto p = f.get_string("tokenizer.ggml.pre");
    if (!p) return p.err();
    pre = *p;
  }
  vocab_spec s = vocab_spec::defaults_for(kind, pre);
  s.name = nm;
  auto toks = f.get_string_array("tokenizer.ggml.tokens");
  if (!toks) return toks.err();
  s.tokens = std::move(*toks);
  if (f.has("tokenizer.ggml.scores")) {
    auto v = f.get_f32_array("tokenizer.ggml.scores");
    if (!v) return v.err();
    s.scores = std::move(*v);
  }
  if (f.has("tokenizer.ggml.token_type")) {
    auto v = f.get_i32_array("tokenizer.ggml.token_type");
    if (!v) return v.err();
    s.types = std::move(*v);
  }
  if (kind == tokenizer_kind::bpe) {
    auto m = f.get_string_array("tokenizer.ggml.merges");
    if (!m) return make_error(m.message() + " (a gpt2 tokenizer needs its merges)");
    s.merges = std::move(*m);
  }
  const int n = static_cast<int>(s.tokens.size());
  // Ids: the file's when inside the vocabulary (llama.cpp keeps its default
  // for an id outside it, as here); defaults outside the vocabulary are none.
  for (auto [key, id] : {std::pair<const char*, int*>{"tokenizer.ggml.bos_token_id", &s.bos},
                         {"tokenizer.ggml.eos_token_id", &s.eos},
                         {"tokenizer.ggml.unknown_token_id", &s.unk},
                         {"tokenizer.ggml.eot_token_id", &s.eot},
                         {"tokenizer.ggml.eom_token_id", &s.eom},
                         {"tokenizer.ggml.padding_token_id", &s.pad}}) {
    if (f.has(key)) {
      auto v = f.get_int(key);
      if (!v) return v.err();
      if (*v >= 0 && *v < n) *id = static_cast<int>(*v);
    }
    if (*id >= n) *id = -1;
  }
  for (auto [key, flag] : {std::pair<const char*, bool*>{"tokenizer.ggml.add_bos_token", &s.add_bos},
                           {"tokenizer.ggml.add_eos_token", &s.add_eos},
                           {"tokenizer.ggml.add_space_prefix", &s.add_space_prefix}}) {
    if (!f.has(key)) continue;
    auto v = f.get_bool(key);
    if (!v) return v.err();
    *flag = *v;
  }
  if (s.add_bos && s.bos < 0) s.add_bos = false;
  return from_vocab(std::move(s));
}

}  // namespace cellshard::model
