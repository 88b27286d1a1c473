// SentencePiece training, encoding and decoding (ringtrain/data/tokenizer.hpp).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <memory>
#include <unordered_map>

#include "ringtrain/core/error.hpp"
#include "ringtrain/data/tokenizer.hpp"

namespace ringtrain::data {
namespace {

// The training text line by line (SentencePiece's unit of training).
class Lines : public sentencepiece::SentenceIterator {
 public:
  explicit Lines(const std::string& t) : t_(t) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (pos_ <= t_.size()) {
      std::size_t end = t_.find('\n', pos_);
      if (end == std::string::npos) end = t_.size();
      line_ = t_.substr(pos_, end - pos_);
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::string& t_;
  std::size_t pos_ = 0;
  std::string line_;
  bool done_ = false;
};

}  // namespace

std::string train_sentencepiece(const std::string& text, std::int64_t vocab, const std::string& what) {
  RT_CHECK(vocab >= 260 && vocab <= (1 << 20), what, ": --vocab-size ", vocab, " for the sentencepiece tokenizer "
           "must be in [260, 1048576] (256 byte pieces, 3 control pieces and at least one more)");
  // Lossless on any text: no normalisation, whitespace and newlines as they are, bytes as fallback.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "unigram"},
      {"vocab_size", std::to_string(vocab)},
      {"hard_vocab_limit", "false"},  // a small text may give fewer pieces
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      {"max_sentence_length", "65536"},
      {"num_threads", "2"},
      {"minloglevel", "2"},  // warnings and errors only
  };
  Lines lines(text);
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  RT_CHECK(st.ok(), what, ": training the sentencepiece tokenizer (--vocab-size ", vocab, ") failed: ", st.ToString());
  return model;
}

struct SentencePiece::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePiece::SentencePiece(const std::string& model_file) : impl_(new Impl), file_(model_file) {
  std::unique_ptr<Impl> guard(impl_);
  std::error_code ec;
  RT_CHECK(std::filesystem::is_regular_file(model_file, ec), model_file, ": no such sentencepiece model file "
           "(written by `ringtrain prepare --dataset text --tokenizer sentencepiece` beside the data)");
  const auto st = impl_->sp.Load(model_file);
  RT_CHECK(st.ok(), model_file, ": not a sentencepiece model: ", st.ToString());
  guard.release();
}

SentencePiece::~SentencePiece() { delete impl_; }

std::vector<std::int32_t> SentencePiece::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto st = impl_->sp.Encode(text, &ids);
  RT_CHECK(st.ok(), file_, ": encoding failed: ", st.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePiece::decode(const std::vector<std::int32_t>& ids) const {
  const std::int64_t v = vocab();
  for (std::size_t i = 0; i < ids.size(); ++i)
    RT_CHECK(ids[i] >= 0 && ids[i] < v, file_, ": token ", i, " = ", ids[i], " is not in the vocabulary [0, ", v, ")");
  std::string out;
  const auto st = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  RT_CHECK(st.ok(), file_, ": decoding failed: ", st.ToString());
  return out;
}

std::int64_t SentencePiece::vocab() const { return impl_->sp.GetPieceSize(); }

std::string tokenizer_model_path(const FileInfo& split) {
  return (std::filesystem::path(split.path).parent_path() / (split.name + ".model")).string();
}

}  // namespace ringtrain::data
