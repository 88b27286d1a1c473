#pragma once
// SentencePiece subword tokenizer for `prepare --dataset text --tokenizer sentencepiece`
// (Kudo & Richardson 2018, Debian's libsentencepiece). The model is trained on the
// training split only and is lossless on any text: identity normalisation, no
// dummy prefix, whitespace kept, and byte fallback (a byte no piece covers, a
// newline included, becomes one of 256 byte pieces), so decode(encode(t)) == t.
// The serialized model is the file `<name>.model` beside the split files
// (tokenizer_model_path) and travels from there into checkpoint.dir.
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/data/schema.hpp"

namespace ringtrain::data {

// Trains a model of at most `vocab` pieces (fewer when the text has fewer to give;
// at least 256 bytes + 3 control pieces + 1) on `text`, one sentence per line;
// returns the serialized model. Errors name `what` (the input).
std::string train_sentencepiece(const std::string& text, std::int64_t vocab, const std::string& what);

class SentencePiece {
 public:
  explicit SentencePiece(const std::string& model_file);  // throws Error naming the file
  ~SentencePiece();
  SentencePiece(const SentencePiece&) = delete;
  SentencePiece& operator=(const SentencePiece&) = delete;
  std::vector<std::int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::int64_t vocab() const;

 private:
  struct Impl;
  Impl* impl_;
  std::string file_;
};

// The model file of a split prepared with tokenizer "sentencepiece": `<name>.model`
// in the split file's directory.
std::string tokenizer_model_path(const FileInfo& split);

}  // namespace ringtrain::data
