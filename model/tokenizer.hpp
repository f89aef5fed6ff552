// model/tokenizer.hpp: the tokenizers cellshard knows, one class with kinds.
//
// Kinds
//  - llama2c: llama2.c's tokenizer.bin and run.c's BPE. File layout: int32
//    max_token_length, then one record per token to the end of the file: float
//    score, int32 length, `length` bytes of the piece (no NUL); the vocabulary
//    size is the number of records (docs/formats.md). encode() reproduces
//    run.c: a dummy-prefix " " token for non-empty text, UTF-8 code points
//    looked up whole with byte fallback (id = byte + 3), then repeated merges
//    of the adjacent pair whose merged piece has the highest score (first pair
//    wins ties). decode() is run.c's decode + safe_printf.
//  - spm: a GGUF vocabulary with tokenizer.ggml.model = "llama" (SentencePiece
//    as llama.cpp's SPM tokenizer runs it): spaces become U+2581, a space is
//    prefixed to text that starts the prompt or follows a special token
//    (tokenizer.ggml.add_space_prefix, default true), then bigrams of adjacent
//    symbols that form a vocabulary piece merge best score first (leftmost on
//    ties), and a final symbol that is not a piece is split back along its
//    merges or falls back to its bytes' <0xNN> tokens.
//  - bpe: a GGUF vocabulary with tokenizer.ggml.model = "gpt2" (byte-level BPE):
//    the text is split by the pre-tokenizer regexes that tokenizer.ggml.pre
//    names ("llama-bpe"/"llama3"/"llama-v3"/"falcon3": Llama 3's; "default" or
//    absent: GPT-2 style), each word's bytes are mapped to printable code points
//    (GPT-2's byte-to-unicode table), and adjacent symbols merge lowest
//    tokenizer.ggml.merges rank first (leftmost on ties). Llama 3's words that
//    are whole vocabulary pieces skip merging (llama.cpp's ignore_merges).
//    Unicode categories (\p{L}, \p{N}, white space) come from ICU's regex
//    engine.
// For both GGUF kinds, control, user-defined and unknown tokens written in the
// text are matched whole first, longest first (llama.cpp's parse_special),
// and stopping follows llama.cpp's end-of-generation set: EOS, EOT (the key or
// a token named <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>,
// <EOT>), EOM (<|eom_id|>).
//
// Immutable after construction; safe to share between threads.
// Errors: open()/from_bytes()/from_vocab() return result<> errors naming the
// file and the field.
#pragma once

#include "model/result.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cellshard::model {

namespace gguf {
class file;
}
struct compiled_regexes;  // ICU patterns of a bpe pre-tokenizer (tokenizer_gguf.cpp)

/// llama2.c's fixed ids (run.c): BOS 1, EOS 2.
constexpr int bos_id = 1;
constexpr int eos_id = 2;

enum class tokenizer_kind { llama2c, spm, bpe };

/// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class token_type : int32_t {
  undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6
};

/// Plain data a GGUF tokenizer is built from (the tokenizer.ggml.* keys).
struct vocab_spec {
  tokenizer_kind kind = tokenizer_kind::spm;  // spm or bpe
  std::string name;                      // for messages: the file it came from
  std::vector<std::string> tokens;       // tokenizer.ggml.tokens
  std::vector<float> scores;             // tokenizer.ggml.scores (empty = all 0)
  std::vector<int32_t> types;            // tokenizer.ggml.token_type (empty = all normal)
  std::vector<std::string> merges;       // tokenizer.ggml.merges, "left right" (bpe)
  std::string pre;                       // tokenizer.ggml.pre (bpe; "" = default)
  // Special ids; -1 = none. Defaults as llama.cpp: spm BOS 1, EOS 2, UNK 0;
  // bpe BOS 11, EOS 11 (set by defaults_for()).
  int bos = -1, eos = -1, unk = -1, eot = -1, eom = -1, pad = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;

  /// A spec with llama.cpp's defaults for `kind` (and for `pre` when bpe):
  /// spm: add_bos, add_space_prefix, BOS 1 EOS 2 UNK 0; bpe: BOS/EOS 11, and
  /// add_bos for the Llama 3 pre-tokenizer names.
  static vocab_spec defaults_for(tokenizer_kind kind, const std::string& pre = "");
};

class tokenizer {
public:
  /// A llama2.c tokenizer.bin, or the tokenizer of a GGUF file (by its magic).
  static result<std::shared_ptr<const tokenizer>> open(const std::string& path);
  /// llama2.c tokenizer.bin bytes.
  static result<std::shared_ptr<const tokenizer>> from_bytes(const std::vector<uint8_t>& bytes,
                                                             const std::string& name);
  /// A GGUF kind from plain data. Errors name spec.name and the field (sizes
  /// that disagree, ids outside the vocabulary, unknown pre-tokenizer).
  static result<std::shared_ptr<const tokenizer>> from_vocab(vocab_spec spec);
  /// The tokenizer of an opened GGUF file (tokenizer.ggml.* keys). Errors:
  /// missing tokenizer.ggml.model / tokens, unsupported model (only "llama"
  /// and "gpt2"), missing merges for gpt2, arrays of the wrong length.
  static result<std::shared_ptr<const tokenizer>> from_gguf(const gguf::file& f);
  /// A byte-level tokenizer with `vocab_size` (>= 260) entries: <unk>, <s>,
  /// </s>, the 256 byte pieces <0x00>..<0xFF>, " ", then filler pieces that
  /// never match text. Used by the built-in synthetic model (kind llama2c).
  static std::shared_ptr<const tokenizer> byte_level(int vocab_size);
  /// Serialises pieces and scores in tokenizer.bin format (any kind; for GGUF
  /// kinds token types, merges and flags are lost).
  std::vector<uint8_t> to_bytes() const;

  tokenizer_kind kind() const { return kind_; }
  /// "llama2.c", "llama (SentencePiece)", "gpt2 (byte-level BPE, pre llama-bpe)".
  std::string kind_name() const;
  int vocab_size() const { return static_cast<int>(vocab_.size()); }
  int max_token_length() const { return max_token_length_; }
  /// The token's text as stored (GGUF: with U+2581 / byte-to-unicode marks).
  const std::string& piece(int id) const { return vocab_[id]; }
  float score(int id) const { return scores_[id]; }
  token_type type(int id) const;
  const std::string& name() const { return name_; }
  uint64_t digest() const { return digest_; }
  int bos() const { return bos_; }
  int eos() const { return eos_; }
  /// -1 when the vocabulary has none.
  int eot() const { return eot_; }
  /// True when encode(text, true, ...) puts BOS first (llama2c: always).
  bool adds_bos() const { return add_bos_; }
  /// The generation stop rule: llama2c stops when BOS is sampled (run.c); GGUF
  /// kinds stop on a token of the end-of-generation set (llama.cpp).
  bool is_stop(int token) const;
  /// The end-of-generation ids (GGUF kinds; llama2c: {BOS}).
  std::vector<int> stop_ids() const;
  /// The id of a control / user-defined token written exactly `text`, or -1.
  int special_id(const std::string& text) const;

  /// Token ids of `text`. llama2c: BOS first when `bos`, EOS last when `eos`
  /// (run.c). GGUF kinds: `bos`/`eos` ask for the model's special tokens, added
  /// only when the model adds them (tokenizer.ggml.add_bos_token /
  /// add_eos_token, llama.cpp's add_special); special tokens written in the
  /// text are matched whole unless `parse_special` is false.
  std::vector<int> encode(const std::string& text, bool bos, bool eos,
                          bool parse_special = true) const;
  /// The bytes printed for `token` following `prev`. llama2c: run.c's decode
  /// + safe_printf (empty when safe_printf prints nothing). GGUF kinds: as
  /// llama.cpp's token_to_piece without specials: U+2581 -> space, byte tokens
  /// -> the byte, byte-level BPE pieces -> their bytes, control and unknown
  /// tokens -> "" (or their text when `special`); spm drops the leading space
  /// of the token after BOS.
  std::string decode(int prev, int token, bool special = false) const;

private:
  int lookup(const std::string& s) const;
  std::vector<int> encode_llama2c(const std::string& text, bool bos, bool eos) const;
  std::string decode_llama2c(int prev, int token) const;
  void spm_segment(const std::string& text, std::vector<int>& out) const;
  void bpe_segment(const std::string& text, std::vector<int>& out) const;
  int byte_token(unsigned char b) const;

  tokenizer_kind kind_ = tokenizer_kind::llama2c;
  std::string name_;
  int max_token_length_ = 0;
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int> index_;
  uint64_t digest_ = 0;
  int bos_ = bos_id, eos_ = eos_id, unk_ = 0, eot_ = -1;
  bool add_bos_ = true, add_eos_ = false, add_space_prefix_ = false;
  // GGUF kinds.
  std::string pre_;
  std::vector<std::string> regexes_;       // pre-tokenizer, applied in order
  std::shared_ptr<const compiled_regexes> compiled_;
  bool ignore_merges_ = false;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::vector<int> specials_;              // matched whole in text, longest first
  std::vector<int> eog_;                   // sorted
  std::vector<int> byte_ids_;              // spm: <0xNN> -> id (-1 none)

public:
  tokenizer() = default;  // use the factories
};

}  // namespace cellshard::model
