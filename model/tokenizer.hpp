// model/tokenizer.hpp: llama2.c's tokenizer.bin format and run.c's BPE.
// File layout: int32 max_token_length, then one record per token to the end of
// the file: float score, int32 length, `length` bytes of the piece (no NUL).
// The vocabulary size is the number of records (docs/formats.md).
//
// encode() and decode() reproduce run.c exactly: a dummy-prefix " " token for
// non-empty text, UTF-8 code points looked up whole with byte fallback
// (id = byte + 3), then repeated merges of the adjacent pair whose merged
// piece has the highest score (first pair wins ties). decode() drops a leading
// space after BOS and maps "<0xXX>" pieces to the raw byte.
// Immutable after load; safe to share between threads.
#pragma once

#include "model/result.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace cellshard::model {

constexpr int bos_id = 1;
constexpr int eos_id = 2;

class tokenizer {
public:
  static result<std::shared_ptr<const tokenizer>> open(const std::string& path);
  static result<std::shared_ptr<const tokenizer>> from_bytes(const std::vector<uint8_t>& bytes,
                                                             const std::string& name);
  /// A byte-level tokenizer with `vocab_size` (>= 260) entries: <unk>, <s>,
  /// </s>, the 256 byte pieces <0x00>..<0xFF>, " ", then filler pieces that
  /// never match text. Used by the built-in synthetic model.
  static std::shared_ptr<const tokenizer> byte_level(int vocab_size);
  /// Serialises back to tokenizer.bin format.
  std::vector<uint8_t> to_bytes() const;

  int vocab_size() const { return static_cast<int>(vocab_.size()); }
  int max_token_length() const { return max_token_length_; }
  const std::string& piece(int id) const { return vocab_[id]; }
  float score(int id) const { return scores_[id]; }
  const std::string& name() const { return name_; }
  uint64_t digest() const { return digest_; }

  /// Token ids of `text`, BOS first when `bos`, EOS last when `eos` (run.c encode).
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const;
  /// The bytes run.c prints for `token` following `prev` (decode + safe_printf):
  /// empty when safe_printf would print nothing.
  std::string decode(int prev, int token) const;

private:
  int lookup(const std::string& s) const;
  std::string name_;
  int max_token_length_ = 0;
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> index_;
  uint64_t digest_ = 0;
};

}  // namespace cellshard::model
