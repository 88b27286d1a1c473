// ringtrain::main, the command line (ringtrain/cli/main.hpp). Subcommands train, export,
// eval, prepare and diagnose; each has --help. Runs under mpirun/srun (one rank per
// device) or as a single process.
#include "ringtrain/cli/main.hpp"

#include <CLI/CLI.hpp>
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <cstdio>
#include <thread>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/parallel/schedule.hpp"
#include "ringtrain/parallel/simulator.hpp"
#include "ringtrain/train/config.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/exit_codes.hpp"
#include "ringtrain/train/family_defaults.hpp"
#include "ringtrain/train/generate.hpp"
#include "ringtrain/train/interop.hpp"
#include "ringtrain/train/plan.hpp"
#include "ringtrain/train/signals.hpp"
#include "ringtrain/train/trainer.hpp"

namespace ringtrain {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;  // filled after parsing, in command-line order
  std::string resume;
  bool no_eval = false, print_config = false, list_keys = false, print_plan = false, print_schedule = false;
  int ranks = 0;  // --print-plan at this many ranks (0 = this job's)
};

// Which exit status an error gets: bad input until training starts, a runtime failure after.
struct Phase {
  int code = exit_code::bad_input;
};

// Shortcuts for the most used keys; each is a --set of its key. When a key is
// given more than once (by --set or a shortcut), the LATER one on the command line
// wins, as with repeated --set: the overrides are applied in command-line order.
struct Overrides {
  std::map<const CLI::Option*, std::string> key_of;  // shortcut option -> key ("" for --set itself)
  std::vector<std::vector<std::string>> storage;      // CLI11 writes each option's values here
};

void add_shortcuts(CLI::App* app, Overrides& o) {
  const std::string models = known_model_list();
  const char* table[][3] = {
      {"--model", "model.name", models.c_str()},
      {"--train-data", "data.train", "training split: .h5 file or prepared directory"},
      {"--test-data", "data.test", "test split: .h5 file or prepared directory"},
      {"--batch-size", "data.batch_size", "samples per rank per micro-batch"},
      {"--epochs", "train.epochs", "epochs"},
      {"--max-steps", "train.max_steps", "stop after this many optimizer steps"},
      {"--seed", "train.seed", "random seed"},
      {"--threads", "train.threads", "compute threads per rank"},
      {"--device", "train.device", "auto | cpu | cuda"},
      {"--precision", "train.precision", "fp32 | tf32 | bf16 | fp16 (fp16: dynamic loss scaling)"},
      {"--optimizer", "optimizer.name", "sgd | adam | adamw | lars | lamb"},
      {"--lr", "optimizer.lr", "base learning rate"},
      {"--init-from", "model.init_from", "start from these weights: a safetensors file or directory (docs/interop.md)"},
      {"--algorithm", "comm.algorithm", "all-reduce: auto | ring | tree | mpi | shm | hierarchical"},
      {"--fusion-threshold", "comm.fusion_threshold", "fusion buffer bytes, 0 = off"},
      {"--cycle-time", "comm.cycle_time_ms", "fusion engine cycle in ms"},
      {"--timeline", "comm.timeline", "write a Chrome-trace timeline here"},
      {"--checkpoint-dir", "checkpoint.dir", "checkpoint directory"},
      {"--metrics", "log.metrics", "JSON-lines metrics file"},
      {"--log-format", "log.format", "auto | bar | plain | json"},
  };
  o.storage.reserve(std::size(table) + 1);
  o.storage.emplace_back();
  o.key_of[app->add_option("--set", o.storage.back(), "override a key: --set section.key=value (repeatable; the later of "
                                                      "--set and a shortcut for one key wins)")] = "";
  for (auto& row : table) {
    o.storage.emplace_back();
    o.key_of[app->add_option(row[0], o.storage.back(), std::string(row[2]) + " (= --set " + row[1] + "=...)")] = row[1];
  }
}

// The overrides as section.key=value, in command-line order.
std::vector<std::string> ordered_overrides(const CLI::App* app, const Overrides& o) {
  std::vector<std::string> out;
  std::map<const CLI::Option*, std::size_t> seen;
  for (const CLI::Option* opt : app->parse_order()) {
    auto it = o.key_of.find(opt);
    if (it == o.key_of.end()) continue;
    const auto& values = opt->results();
    std::size_t i = seen[opt]++;
    if (i >= values.size()) continue;
    out.push_back(it->second.empty() ? values[i] : it->second + "=" + values[i]);
  }
  return out;
}

// Every rank reads the configuration; a bad file or key ends the job with one message.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& sets, const Communicator& world) {
  TrainConfig cfg;
  std::vector<std::string> applied;
  run_agreed(world, "reading the configuration", [&] {
    if (!path.empty()) cfg.load_toml(path);
    for (const auto& s : sets) cfg.set(s);
    applied = apply_family_defaults(cfg, given_keys(path, sets));  // never a key the user gave
    cfg.validate();
    check_environment(cfg);
  });
  std::string keys;
  for (const auto& k : applied) keys += (keys.empty() ? "" : ", ") + k;
  if (world.rank() == 0 && !applied.empty())
    log::info("model.name = ", cfg.model.name, " takes its family's defaults for ", keys,
              " (docs/configuration.md; keys given in the file or on the command line are kept)");
  return cfg;
}

int run_train(const TrainArgs& a, const Communicator& world, Phase& phase) {
  if (a.list_keys) {
    if (world.rank() == 0)
      for (const auto& k : TrainConfig::keys()) std::printf("  %s\n", k.c_str());
    return 0;
  }
  TrainConfig cfg = load_config(a.config, a.sets, world);
  if (a.print_config) {
    if (world.rank() == 0) std::printf("%s", cfg.to_toml().c_str());
    return 0;
  }
  if (a.print_schedule) {
    std::string text;
    run_agreed(world, "printing the pipeline schedule", [&] {
      const RunPlan plan = plan_run(cfg, a.ranks > 0 ? a.ranks : world.size());
      const int m = plan.micro_batches * plan.accumulation;
      const Schedule s = step_schedule(parse_schedule(cfg.parallel.schedule), cfg.parallel.schedule, plan.pipeline,
                                       m, cfg.parallel.virtual_stages);
      const SimResult r = simulate(s);
      text = cat("# parallel.schedule = ", cfg.parallel.schedule, ": ", plan.pipeline, " pipeline ranks x ",
                 s.layout.chunks, " chunks, ", m, " micro-batches per step; cells STAGE{F|B|I|W}MICROBATCH, one "
                 "column per time unit (F = I = W = 1 per chunk, B = 2)\n",
                 schedule_table(s), "# unit-time play: step ", r.makespan, " units, mean bubble ", r.mean_bubble(),
                 "\n# as a table file for parallel.schedule = FILE.csv:\n", schedule_csv(s));
    });
    if (world.rank() == 0) std::printf("%s", text.c_str());
    return 0;
  }
  if (a.print_plan) {
    RunPlan plan;
    run_agreed(world, "planning the layout", [&] { plan = plan_run(cfg, a.ranks > 0 ? a.ranks : world.size()); });
    if (world.rank() == 0) std::printf("%s\n", plan.json().c_str());
    return 0;
  }
  StopSignals::install();
  TrainerHooks hooks;
  hooks.evaluate = !a.no_eval;
  hooks.stop_signal = &StopSignals::pending;
  run_on_root(world, "copying the tokenizer into checkpoint.dir", [&] { keep_tokenizer_with_run(cfg); });
  Trainer trainer(cfg, world, hooks);
  if (!a.resume.empty()) trainer.resume(a.resume);
  phase.code = exit_code::failure;
  TrainResult r = trainer.fit();
  if (r.stopped_by_signal) return exit_code::stopped;  // the trainer said what happened and where it saved
  if (world.rank() == 0 && !r.last.evaluated) log::info("done: ", r.steps, " steps (no evaluation)");
  if (world.rank() == 0 && r.last.evaluated) {
    log::info("done: ", r.steps, " steps, final test accuracy ", 100 * r.last.test_accuracy, "%, best ",
              100 * r.best_test_accuracy, "%");
    if (cfg.train.target_accuracy > 0) {
      if (r.target_epoch > 0)
        log::info("target test accuracy ", 100 * cfg.train.target_accuracy, "% reached at epoch ", r.target_epoch,
                  " after ", r.target_time_s, " s");
      else
        log::info("target test accuracy ", 100 * cfg.train.target_accuracy, "% NOT reached");
    }
  }
  return 0;
}

struct GenerateArgs {
  std::string config, checkpoint, prompt;
  std::vector<std::string> sets;
  GenerateOptions opt;
};

// One rank samples (the others wait): the configuration is the checkpoint's
// unless --config gives one.
int run_generate(const GenerateArgs& a, const Communicator& world) {
  int rc = 0;
  run_on_root(world, "generate", [&] {
    TrainConfig cfg;
    if (!a.config.empty()) {
      cfg.load_toml(a.config);
    } else {
      const auto path = std::filesystem::temp_directory_path() / cat("rt-generate-", ::getpid(), ".toml");
      std::ofstream(path) << find_checkpoint_head(a.checkpoint).data.config_toml;  // no tensor data read
      try {
        cfg.load_toml(path.string());
      } catch (...) {
        std::filesystem::remove(path);
        throw;
      }
      std::filesystem::remove(path);
    }
    for (const auto& s : a.sets) cfg.set(s);
    const GeneratedText g = generate_from_checkpoint(cfg, a.checkpoint, a.prompt, a.opt,
                                                       Communicator::dup_of(MPI_COMM_SELF, "generate"));
    std::fwrite(g.text.data(), 1, g.text.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
  });
  return rc;
}

struct EvalArgs {
  std::string config, checkpoint, data;
  std::vector<std::string> sets;
};

int run_eval(const EvalArgs& a, const Communicator& world) {
  TrainConfig cfg = load_config(a.config, a.sets, world);
  if (!a.data.empty()) cfg.data.test = a.data;
  TrainerHooks hooks;
  hooks.report = false;
  RT_CHECK(!a.checkpoint.empty() || !cfg.model.init_from.empty(), "eval needs --checkpoint, or weights to import "
           "(--set model.init_from=PATH)");
  Trainer trainer(cfg, world, hooks);
  if (a.checkpoint.empty()) {  // the imported weights themselves; the loss in full precision to compare
    EvalResult r = trainer.evaluate(cfg.data.test);
    if (world.rank() == 0)
      std::printf("eval model.init_from %s on %s: loss %.12g accuracy %.2f%% (%lld samples)\n",
                  trainer.config().model.init_from.c_str(), cfg.data.test.c_str(), r.loss, 100 * r.accuracy,
                  static_cast<long long>(r.samples));
    return 0;
  }
  const LoadedCheckpoint ck = trainer.load_weights(a.checkpoint);
  EvalResult r = trainer.evaluate(cfg.data.test);
  // The file, not just the directory asked for: "the newest" is resolved here.
  if (world.rank() == 0)
    std::printf("eval %s (run %s, global step %lld, %s) on %s: loss %.4f accuracy %.2f%% (%lld samples)\n",
                ck.file.c_str(), ck.run_id.c_str(), static_cast<long long>(ck.step),
                ck.step_in_epoch ? cat("epoch ", ck.epochs_done + 1, " step ", ck.step_in_epoch).c_str()
                                 : cat(ck.epochs_done, " epoch(s) done").c_str(),
                cfg.data.test.c_str(), r.loss, 100 * r.accuracy, static_cast<long long>(r.samples));
  return 0;
}

struct ExportArgs {
  std::string checkpoint, out, format = "safetensors", dtype = "f32", shard_size = "0";
};

// "5GB", "500MB", "2GiB", "1000000" -> bytes (decimal units, as Hugging Face's max_shard_size).
std::int64_t parse_bytes(const std::string& s) {
  std::size_t end = 0;
  double v = -1;
  try {
    v = std::stod(s, &end);
  } catch (const std::exception&) {
  }
  const std::string unit = s.substr(std::min(end, s.size()));
  const std::map<std::string, double> units = {{"", 1},      {"B", 1},         {"KB", 1e3},      {"MB", 1e6},
                                               {"GB", 1e9},  {"KiB", 1024.0},  {"MiB", 1048576.0},
                                               {"GiB", 1073741824.0}};
  const auto u = units.find(unit);
  RT_CHECK(v >= 0 && u != units.end(), "export --shard-size '", s, "': give bytes, e.g. 5GB, 500MB, 2GiB or 1000000");
  return static_cast<std::int64_t>(v * u->second);
}

// Every rank verifies its share of the checkpoint and writes its share of the files.
int run_export(const ExportArgs& a, const Communicator& world) {
  ExportOptions o;
  run_agreed(world, "export", [&] {
    o.format = a.format;
    RT_CHECK(a.dtype == "f32" || a.dtype == "bf16", "export --dtype '", a.dtype, "': f32 or bf16");
    o.dtype = a.dtype == "bf16" ? DType::bf16 : DType::f32;
    o.shard_bytes = parse_bytes(a.shard_size);
  });
  const std::string file = export_checkpoint(a.checkpoint, a.out, o, world);
  if (world.rank() == 0) std::printf("export %s -> %s\n", a.checkpoint.c_str(), file.c_str());
  return 0;
}

struct PrepareArgs {
  std::string dataset = "fashion-mnist", input, out, check;
  int shards = 1, chunk = 0, deflate = 0;
  // synthetic
  std::int64_t samples = 1024, test_samples = 256, channels = 3, height = 224, width = 224, classes = 10;
  std::uint64_t seed = 1;
  // text / tokens
  double val_fraction = 0.1;
  std::int64_t vocab = 0;
  std::string tokenizer = "bytes", format = "h5";
};

int run_prepare(const PrepareArgs& a, const Communicator& world) {
  if (!a.check.empty()) {
    std::string summary;
    run_agreed(world, "prepare --check", [&] { summary = data::check_prepared(a.check); });
    if (world.rank() == 0) std::printf("%s\n", summary.c_str());
    return 0;
  }
  RT_CHECK(!a.out.empty(), "prepare needs --out DIR (or --check DIR to validate prepared files)");
  data::StorageOptions st;
  st.num_shards = a.shards;
  st.chunk_samples = a.chunk;
  st.deflate = a.deflate;
  data::PreparedDataset ds;
  if (a.dataset == "text" || a.dataset == "tokens") {
    RT_CHECK(!a.input.empty(), "prepare --dataset ", a.dataset, " needs --input ",
             a.dataset == "text" ? "FILE or DIR (UTF-8 text)" : "FILE (llm.c .bin or .npy tokens)");
    data::TokenPrepareOptions o;
    o.input = a.input;
    o.output = a.out;
    o.source = a.dataset == "text" ? data::TokenSource::text : data::TokenSource::tokens;
    o.vocab = a.vocab;
    o.tokenizer = a.tokenizer;
    o.val_fraction = a.val_fraction;
    o.format = a.format;
    ds = data::prepare_tokens(o, world);
    if (world.rank() == 0 && o.format == "llmc") {
      std::printf("prepared %s: %lld train tokens in %s, %lld validation tokens in %s (llm.c's token shards, "
                  "vocabulary %lld, %s)\n", ds.train.name.c_str(), static_cast<long long>(ds.train.total_count),
                  ds.train_files.front().c_str(),
                  static_cast<long long>(data::read_token_file(ds.test_files.front()).size()),
                  ds.test_files.front().c_str(), static_cast<long long>(ds.train.vocab), ds.train.tokenizer.c_str());
      return 0;
    }
    if (world.rank() == 0) {
      const data::FileInfo test = data::read_file_info(ds.test_files.front());
      std::printf("prepared %s: %lld train tokens, %lld validation tokens, vocabulary %lld (%s) under %s\n",
                  ds.train.name.c_str(), static_cast<long long>(ds.train.total_count),
                  static_cast<long long>(test.total_count), static_cast<long long>(ds.train.vocab),
                  ds.train.tokenizer.c_str(), a.out.c_str());
    }
    return 0;
  }
  RT_CHECK(a.format == "h5", "prepare --format ", a.format, " is for --dataset text or tokens (llm.c's token "
           "shards); --dataset ", a.dataset, " is written as ringtrain's HDF5 only");
  if (a.dataset == "synthetic") {
    data::SyntheticOptions o;
    o.output = a.out;
    o.train_samples = a.samples;
    o.test_samples = a.test_samples;
    o.channels = a.channels;
    o.height = a.height;
    o.width = a.width;
    o.num_classes = a.classes;
    o.seed = a.seed;
    o.storage = st;
    ds = data::generate_synthetic(o, world);
  } else {
    data::PrepareOptions o;
    o.output = a.out;
    o.storage = st;
    if (a.dataset == "fashion-mnist") {
      o.input = a.input.empty() ? "/usr/share/datasets/fashion-mnist" : a.input;
      o.format = data::SourceFormat::idx;
      o.name = "fashion-mnist";
    } else if (a.dataset == "mnist" || a.dataset == "idx") {
      RT_CHECK(!a.input.empty(), "prepare --dataset ", a.dataset, " needs --input DIR with the IDX files");
      o.input = a.input;
      o.format = data::SourceFormat::idx;
      if (a.dataset == "mnist") o.name = "mnist";
    } else if (a.dataset == "cifar10") {
      RT_CHECK(!a.input.empty(), "prepare --dataset cifar10 needs --input DIR with data_batch_*.bin");
      o.input = a.input;
      o.format = data::SourceFormat::cifar10;
      o.name = "cifar10";
    } else if (a.dataset == "npz" || a.dataset == "images") {
      RT_CHECK(!a.input.empty(), "prepare --dataset ", a.dataset, " needs --input ",
               a.dataset == "npz" ? "FILE.npz (x_train, y_train, x_test, y_test)"
                                  : "DIR with train/<class>/ and test/<class>/ image folders");
      o.input = a.input;
      o.format = a.dataset == "npz" ? data::SourceFormat::npz : data::SourceFormat::images;
    } else {
      RT_FAIL("prepare: unknown --dataset '", a.dataset,
              "' (fashion-mnist, mnist, idx, cifar10, npz, images, synthetic, text, tokens)");
    }
    ds = data::prepare_dataset(o, world);
  }
  if (world.rank() == 0) {
    std::printf("prepared %s: %lld train samples [%lld, %lld, %lld] in %zu file(s), %zu test file(s) under %s\n",
                ds.train.name.c_str(), static_cast<long long>(ds.train.total_count),
                static_cast<long long>(ds.train.channels), static_cast<long long>(ds.train.height),
                static_cast<long long>(ds.train.width), ds.train_files.size(), ds.test_files.size(), a.out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator world = Communicator::world();

  CLI::App app{"ringtrain: neural-network training under MPI on a data x pipeline x tensor process grid:\n"
               "data parallelism (gradients averaged by ring/tree/shared-memory all-reduce with tensor fusion),\n"
               "pipeline parallelism (parallel.pipeline stages; schedules afab, 1f1b, zb-h1) and\n"
               "tensor parallelism (parallel.tensor shards of every layer), with ZeRO-1/2 (parallel.zero)"};
  app.require_subcommand(1);
  app.footer("Run under MPI, one rank per device (ranks = data x pipeline x tensor):\n"
             "  mpirun -np 2 ringtrain train --config jobs/fashion_cnn.toml\n"
             "  mpirun -np 4 --oversubscribe ringtrain train --config jobs/fashion_cnn.toml --set parallel.pipeline=2\n"
             "Plan a layout without running it: ringtrain train --config FILE --print-plan --ranks 8\n"
             "Settings are configuration keys (docs/configuration.md); the few environment variables\n"
             "(RINGTRAIN_LOG=debug|info|warn|error, ...) are in docs/environment.md");

  TrainArgs ta;
  Overrides overrides;
  auto* train = app.add_subcommand("train", "train a model on the data x pipeline x tensor grid (one rank per device)");
  train->add_option("-c,--config", ta.config, "TOML configuration (see jobs/*.toml; defaults otherwise)")
      ->check(CLI::ExistingFile);
  train->add_option("--resume", ta.resume,
                    "continue from a checkpoint file, the newest intact one in a directory, or `auto`: "
                    "checkpoint.dir's newest of this configuration if any, else a new run");
  train->add_flag("--no-eval", ta.no_eval, "skip the per-epoch test-set evaluation");
  train->add_flag("--print-config", ta.print_config, "print the effective configuration as TOML and exit");
  train->add_flag("--list-keys", ta.list_keys, "list every configuration key and exit");
  train->add_flag("--print-plan", ta.print_plan,
                  "print the resolved layout and batch split as JSON and exit; exit status 2 (naming the key) when "
                  "the configuration cannot run at that rank count");
  train->add_flag("--print-schedule", ta.print_schedule,
                  "print the pipeline schedule's table (rank x time unit, as the simulator plays it) and the same "
                  "as a table file for parallel.schedule = FILE.csv, and exit");
  train->add_option("--ranks", ta.ranks,
                    "with --print-plan or --print-schedule: plan for this many ranks (default: this job's)")
      ->check(CLI::PositiveNumber);
  add_shortcuts(train, overrides);

  EvalArgs ea;
  auto* eval = app.add_subcommand("eval", "evaluate a checkpoint on a test split (spread across ranks)");
  eval->add_option("--checkpoint", ea.checkpoint, "checkpoint file, or a directory (newest); without it, the "
                   "weights of model.init_from");
  eval->add_option("-c,--config", ea.config, "TOML configuration (model and data); default: as in training")
      ->check(CLI::ExistingFile);
  eval->add_option("--data", ea.data, "test split: .h5 file or prepared directory (default data.test)");
  eval->add_option("--set", ea.sets, "override a key: --set section.key=value");

  GenerateArgs ga;
  auto* gen = app.add_subcommand("generate", "sample text from a language model's checkpoint (one rank)");
  gen->add_option("--checkpoint", ga.checkpoint, "checkpoint file, or a directory (newest)")->required();
  gen->add_option("--prompt", ga.prompt, "the text to continue (token ids separated by spaces for a tokens data "
                  "set)")->required();
  gen->add_option("--tokens", ga.opt.tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  gen->add_option("--temperature", ga.opt.temperature, "softmax temperature (0 = greedy)")->capture_default_str();
  gen->add_option("--top-k", ga.opt.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  gen->add_option("--seed", ga.opt.seed, "random seed (the same seed gives the same text)")->capture_default_str();
  gen->add_option("-c,--config", ga.config, "TOML configuration; default: the checkpoint's")
      ->check(CLI::ExistingFile);
  gen->add_option("--set", ga.sets, "override a key: --set section.key=value");

  ExportArgs xa;
  auto* exp = app.add_subcommand("export", "write a checkpoint's weights for other frameworks (docs/interop.md)");
  exp->add_option("--checkpoint", xa.checkpoint, "checkpoint file, or a directory (newest intact)")->required();
  exp->add_option("--format", xa.format, "safetensors (Hugging Face names: GPT-2's for gpt) | llmc (llm.c's GPT-2 "
                  "model file, --out FILE)")->capture_default_str();
  exp->add_option("--out", xa.out, "a .safetensors file, or a directory (model.safetensors + config.json)")
      ->required();
  exp->add_option("--dtype", xa.dtype, "f32 | bf16 (rounded to nearest even)")->capture_default_str();
  exp->add_option("--shard-size", xa.shard_size, "above this many bytes (5GB, 500MB, 2GiB), files of at most this "
                  "size and model.safetensors.index.json, each rank writing its own (0: one file)")
      ->capture_default_str();

  PrepareArgs pa;
  auto* prep = app.add_subcommand("prepare", "convert a data set to ringtrain's HDF5 schema (data/SCHEMA.md)");
  prep->add_option("--dataset", pa.dataset,
                   "fashion-mnist | mnist | idx | cifar10 | npz | images | synthetic | text | tokens")
      ->capture_default_str();
  prep->add_option("--input", pa.input, "raw files: a directory (default for fashion-mnist: Debian's), a .npz "
                   "(npz), DIR with train/<class>/ and test/<class>/ PNG/JPEG folders (images), a text FILE or DIR (text), "
                   "an llm.c .bin or a .npy of tokens (tokens)");
  prep->add_option("--out", pa.out, "output directory");
  prep->add_option("--check", pa.check, "validate the prepared files in DIR against the schema and exit");
  prep->add_option("--shards", pa.shards, "files per split (1 = single file; 0 = one per rank)")->capture_default_str();
  prep->add_option("--chunk", pa.chunk, "samples per HDF5 chunk (0 = automatic)")->capture_default_str();
  prep->add_option("--deflate", pa.deflate, "gzip level 0-9 (0 = none)")->capture_default_str()->check(CLI::Range(0, 9));
  prep->add_option("--samples", pa.samples, "synthetic: train samples")->capture_default_str();
  prep->add_option("--test-samples", pa.test_samples, "synthetic: test samples")->capture_default_str();
  prep->add_option("--channels", pa.channels, "synthetic: channels")->capture_default_str();
  prep->add_option("--height", pa.height, "synthetic: height")->capture_default_str();
  prep->add_option("--width", pa.width, "synthetic: width")->capture_default_str();
  prep->add_option("--classes", pa.classes, "synthetic: classes")->capture_default_str();
  prep->add_option("--seed", pa.seed, "synthetic: seed")->capture_default_str();
  prep->add_option("--val-fraction", pa.val_fraction, "text, tokens: the fraction of the tokens (from the end) "
                   "kept for validation (the test split)")->capture_default_str();
  prep->add_option("--vocab,--vocab-size", pa.vocab, "tokens: vocabulary size (0 = the largest token + 1); text with "
                   "--tokenizer sentencepiece: the pieces to train")->capture_default_str();
  prep->add_option("--format", pa.format, "text, tokens: h5 (ringtrain's files) | llmc (llm.c's token shards "
                   "NAME_train.bin and NAME_val.bin, which llm.c trains on; docs/interop.md)")->capture_default_str();
  prep->add_option("--tokenizer", pa.tokenizer, "text: bytes (UTF-8 bytes, vocabulary 256) | sentencepiece (a subword "
                   "model trained on the training split, written beside the data as NAME.model)")->capture_default_str();

  std::string diag_dir;
  auto* diag = app.add_subcommand("diagnose", "name the first collective the ranks of a stalled or crashed run "
                                              "disagree on, from its flight records (docs/failures.md)");
  diag->add_option("DIR", diag_dir, "the records' directory (comm.flight_recorder_dir)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same arguments: rank 0 prints, all return the same status.
    if (world.rank() == 0) app.exit(e);
    return e.get_exit_code() == 0 ? exit_code::ok : exit_code::bad_input;
  }
  ta.sets = ordered_overrides(train, overrides);

  Phase phase;
  try {
    if (*train) return run_train(ta, world, phase);
    phase.code = exit_code::bad_input;
    if (*eval) return run_eval(ea, world);
    if (*gen) return run_generate(ga, world);
    if (*exp) return run_export(xa, world);
    if (*prep) return run_prepare(pa, world);
    if (*diag) {
      if (world.rank() == 0) std::fputs(flight_recorder::diagnose(diag_dir).c_str(), stdout);
      return exit_code::ok;
    }
  } catch (const CollectiveError& e) {
    // Raised on every rank together: one message, the same status everywhere.
    if (world.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return phase.code;
  } catch (const std::exception& e) {
    log::error(e.what());
    if (world.size() > 1) {
      // Errors found by every rank (bad config or data) are printed by each; an
      // error on one rank ends the job so that the others never wait for it.
      // MPI_Abort's status becomes the job's: non-zero whatever the launcher does next.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      MPI_Abort(MPI_COMM_WORLD, phase.code);
    }
    return phase.code;
  }
  return exit_code::ok;
}

}  // namespace ringtrain
