#pragma once
// Sampling text from a trained language model (`ringtrain generate`).
//
// Rules:
//  - one rank, the whole model (a checkpoint of any layout is loaded into the
//    1-rank layout, as `ringtrain eval` does);
//  - each new token is drawn from the logits at the last position of the
//    context (the prompt and what has been generated, its last data.seq_len
//    tokens), divided by the temperature, restricted to the top_k largest
//    (0: all); temperature 0 takes the largest (greedy). The causal model is
//    run on a full window of data.seq_len tokens, the context left-aligned and
//    padded with token 0: positions after the context cannot affect it;
//  - reproducible: the draws come from mt19937_64(seed) alone, so the same
//    checkpoint, prompt and options give the same tokens on every machine.
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/train/config.hpp"

namespace ringtrain {

class Stage;

struct GenerateOptions {
  std::int64_t tokens = 200;  // new tokens to draw
  double temperature = 1.0;   // 0: greedy
  std::int64_t top_k = 0;     // 0: the whole vocabulary
  std::uint64_t seed = 0;
};

// Appends o.tokens tokens to `prompt` (non-empty) with `model` (the whole
// language model, logits [N, seq_len, vocab]); returns the new tokens.
std::vector<std::int32_t> sample_tokens(Stage& model, std::int64_t seq_len, const std::vector<std::int32_t>& prompt,
                                        const GenerateOptions& o);

struct GeneratedText {
  std::vector<std::int32_t> prompt, tokens;
  bool bytes = false;  // the byte tokenizer: `text` is the prompt and the tokens as bytes
  std::string text;    // sentencepiece: decoded by its model; else the token ids, space-separated
};

// cfg: the training configuration (as stored in the checkpoint); `prompt` is
// text for the byte and sentencepiece tokenizers (the latter's model from the
// run directory, run_tokenizer_path, else beside the data), else space-separated token ids. Loads the
// newest checkpoint under `checkpoint` on `self` (one rank).
GeneratedText generate_from_checkpoint(TrainConfig cfg, const std::string& checkpoint, const std::string& prompt,
                                       const GenerateOptions& o, const Communicator& self);

// A run's copy of its data's sentencepiece model: <checkpoint.dir>/tokenizer.model.
std::string run_tokenizer_path(const std::string& run_dir);
// Copies the training data's sentencepiece model (if it has one) into checkpoint.dir (if set),
// so that the run's checkpoints decode without the data. Throws Error naming the files.
void keep_tokenizer_with_run(const TrainConfig& cfg);

}  // namespace ringtrain
