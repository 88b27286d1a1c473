// `ringtrain generate`: sampling from a language model (train/generate.hpp).
#include "ringtrain/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>

#include "ringtrain/data/schema.hpp"
#include "ringtrain/data/tokenizer.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/train/trainer.hpp"
#include "run_options.hpp"

namespace ringtrain {

std::vector<std::int32_t> sample_tokens(Stage& model, std::int64_t seq_len, const std::vector<std::int32_t>& prompt,
                                        const GenerateOptions& o) {
  RT_CHECK(!prompt.empty(), "generate: the prompt is empty (give at least one token)");
  RT_CHECK(o.temperature >= 0 && std::isfinite(o.temperature), "generate: --temperature ", o.temperature,
           " must be >= 0");
  RT_CHECK(o.top_k >= 0, "generate: --top-k ", o.top_k, " must be >= 0");
  std::mt19937_64 rng(o.seed);
  std::vector<std::int32_t> ctx = prompt, out;
  Tensor x = Tensor::zeros({1, seq_len});
  std::vector<std::pair<float, std::int32_t>> order;
  for (std::int64_t n = 0; n < o.tokens; ++n) {
    const std::int64_t len = std::min<std::int64_t>(std::int64_t(ctx.size()), seq_len);
    float* xs = x.data<float>();
    std::fill(xs, xs + seq_len, 0.f);
    for (std::int64_t i = 0; i < len; ++i) xs[i] = float(ctx[ctx.size() - std::size_t(len) + std::size_t(i)]);
    const Tensor logits = model.forward(0, x, Mode::eval);
    RT_CHECK(logits.ndim() == 3 && logits.dim(1) == seq_len, "generate: the model gives ", shape_str(logits.shape()),
             ", not per-token logits [1, ", seq_len, ", vocab] (a language model such as gpt)");
    const std::int64_t vocab = logits.dim(2);
    const float* row = logits.data<float>() + (len - 1) * vocab;
    order.clear();
    for (std::int64_t v = 0; v < vocab; ++v) order.emplace_back(row[v], std::int32_t(v));
    // Largest first, ties to the smaller id: the same order on every machine.
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    std::int32_t next = order.front().second;
    if (o.temperature > 0) {
      const std::size_t k = o.top_k > 0 ? std::min<std::size_t>(std::size_t(o.top_k), order.size()) : order.size();
      std::vector<double> p(k);
      double z = 0;
      for (std::size_t i = 0; i < k; ++i) z += p[i] = std::exp((double(order[i].first) - order[0].first) / o.temperature);
      // A uniform double in [0, 1) from the top 53 bits: no library-specific distribution.
      double u = double(rng() >> 11) * 0x1.0p-53 * z;
      std::size_t i = 0;
      while (i + 1 < k && u >= p[i]) u -= p[i++];
      next = order[i].second;
    }
    out.push_back(next);
    ctx.push_back(next);
  }
  return out;
}

GeneratedText generate_from_checkpoint(TrainConfig cfg, const std::string& checkpoint, const std::string& prompt,
                                       const GenerateOptions& o, const Communicator& self) {
  // The 1-rank layout: a checkpoint of any layout reshards into it.
  for (const DimInfo& d : kDims)
    if (*d.key) cfg.set(cat(d.key, "=1"));
  cfg.set("parallel.zero=0");
  cfg.set("parallel.micro_batches=0");
  cfg.set("data.global_batch=0");
  cfg.set("train.accumulation=1");
  cfg.checkpoint.dir.clear();
  cfg.log.metrics.clear();
  cfg.validate();
  const data::FileInfo info = data::read_file_info(data::find_split_files(cfg.data.train, "train").front());
  RT_CHECK(info.tokens(), "generate: data.train = '", cfg.data.train, "' holds images, not tokens: ",
           "generate samples from a language model");
  TrainerHooks hooks;
  hooks.report = false;
  hooks.evaluate = false;
  Trainer trainer(cfg, self, hooks);
  trainer.load_weights(checkpoint);
  Stage model(model_config(cfg, info), Device::cpu());
  ParamArena& from = trainer.parameters();
  RT_CHECK(from.size() == model.arena().size(), "generate: the model has ", model.arena().size(),
           " parameters, the checkpoint's run ", from.size());
  for (std::size_t i = 0; i < from.size(); ++i) model.arena().param(i).copy_from(from.param(i));
  GeneratedText g;
  g.bytes = info.tokenizer == "bytes";
  std::unique_ptr<data::SentencePiece> sp;
  if (info.tokenizer == "sentencepiece") {
    std::error_code ec;
    std::string file = run_tokenizer_path(std::filesystem::is_directory(checkpoint, ec)
                                              ? checkpoint
                                              : std::filesystem::path(checkpoint).parent_path().string());
    if (!std::filesystem::is_regular_file(file, ec)) file = data::tokenizer_model_path(info);
    sp = std::make_unique<data::SentencePiece>(file);
    RT_CHECK(sp->vocab() == info.vocab, "generate: ", file, " has ", sp->vocab(), " pieces, data.train = '",
             cfg.data.train, "' a vocabulary of ", info.vocab, " (another tokenizer's model?)");
    g.prompt = sp->encode(prompt);
  } else if (g.bytes) {
    g.prompt.assign(prompt.begin(), prompt.end());
    for (auto& t : g.prompt) t = std::int32_t(std::uint8_t(t));  // UTF-8 bytes
  } else {
    std::istringstream in(prompt);
    std::int64_t id = 0;
    while (in >> id) {
      RT_CHECK(id >= 0 && id < info.vocab, "generate: prompt token ", id, " is not in the vocabulary [0, ", info.vocab,
               ")");
      g.prompt.push_back(std::int32_t(id));
    }
    RT_CHECK(in.eof(), "generate: the data's tokenizer is '", info.tokenizer, "': give --prompt as token ids "
             "separated by spaces");
  }
  g.tokens = sample_tokens(model, cfg.data.seq_len, g.prompt, o);
  std::vector<std::int32_t> all = g.prompt;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end());
  if (sp) {
    g.text = sp->decode(all);
  } else if (g.bytes) {
    for (auto t : all) g.text.push_back(char(std::uint8_t(t)));
  } else {
    for (auto t : all) g.text += cat(g.text.empty() ? "" : " ", t);
  }
  return g;
}

std::string run_tokenizer_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "tokenizer.model").string();
}

void keep_tokenizer_with_run(const TrainConfig& cfg) {
  if (cfg.checkpoint.dir.empty() || cfg.data.train.empty()) return;
  data::FileInfo info;
  try {
    info = data::read_file_info(data::find_split_files(cfg.data.train, "train").front());
  } catch (const Error&) {
    return;  // a missing or bad data file: the trainer names it, after its own earlier checks
  }
  if (info.tokenizer != "sentencepiece") return;
  const std::string from = data::tokenizer_model_path(info), to = run_tokenizer_path(cfg.checkpoint.dir);
  std::error_code ec;
  std::filesystem::create_directories(cfg.checkpoint.dir, ec);
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, ec);
  RT_CHECK(!ec, "data.train = '", cfg.data.train, "': cannot copy its tokenizer ", from, " to ", to, ": ",
           ec.message());
}

}  // namespace ringtrain
