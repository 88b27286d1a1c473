#pragma once
// Dataset preparation (`ringtrain prepare`): raw IDX / CIFAR-10 batches, or a
// synthetic generator, to the HDF5 schema of data/SCHEMA.md.
// Rules kept:
//  - collective over `comm`: shard s of a split is written by rank s % p, the
//    single file by rank 0; an error on any rank is raised on every rank;
//  - every file is written to "<final>.tmp-<pid>" and renamed into place only
//    when complete, so a killed prepare never leaves a half file under a final name;
//  - mean/std are computed over the whole train split (exactly, reduced over
//    ranks for the synthetic generator) and stored in both splits.
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/data/schema.hpp"

namespace ringtrain::data {

// npz: `input` is a .npz file; images: `input` has train/<class>/ and test/<class>/ folders.
enum class SourceFormat { auto_detect, idx, cifar10, npz, images };

struct StorageOptions {
  // Files per split: 1 = single-file layout ("<name>-<split>.h5", each rank reads
  // its samples by hyperslab); K > 1 = shard layout. 0 = one shard per rank.
  int num_shards = 1;
  // Samples per HDF5 chunk along N; 0 = automatic (about 256 KiB per chunk,
  // i.e. 334 Fashion-MNIST images): big enough for sequential batch reads,
  // small enough that a scattered (globally shuffled) read touches little extra.
  // -1 = contiguous layout (no chunks, no compression): best for MPI-IO collective reads.
  int chunk_samples = 0;
  int deflate = 0;  // 0 = uncompressed (fastest scattered reads), 1..9 = gzip level (+shuffle filter)
};

struct PrepareOptions {
  std::string input;   // directory holding the raw files
  std::string output;  // directory for the .h5 files (created)
  SourceFormat format = SourceFormat::auto_detect;
  std::string name;    // data set name; "" = guessed ("fashion-mnist", "mnist", "cifar10")
  std::vector<std::string> class_names;  // "" = known names for the guessed data set, else "0".."K-1"
  // IDX file names inside `input` ("" = the standard MNIST names, with or without .gz).
  std::string train_images, train_labels, test_images, test_labels;
  StorageOptions storage;
};

struct PreparedDataset {
  std::vector<std::string> train_files, test_files;  // shard order
  FileInfo train;                                     // attributes of the train split (shard 0)
};

PreparedDataset prepare_dataset(const PrepareOptions& opt, const Communicator& comm);

// `ringtrain prepare --check DIR`: every file of both splits against the
// schema (attributes, datasets, dtypes, shapes) and against each other (image
// size, classes, shard order and counts). Returns a one-line summary; throws
// Error naming the file and what is wrong.
std::string check_prepared(const std::string& dir);

// Synthetic, learnable images: class k has a smooth mean pattern (per-channel
// sinusoids whose frequency and phase depend on k) plus uniform noise of
// amplitude `noise`; labels are uniform over classes. Content depends only on
// (seed, global sample index), never on the shard count or the rank count.
struct SyntheticOptions {
  std::string output;
  std::string name = "synthetic";
  std::int64_t train_samples = 1024, test_samples = 0;
  std::int64_t channels = 3, height = 224, width = 224;
  std::int64_t num_classes = 10;
  std::uint64_t seed = 1;
  int noise = 48;              // 0..255
  bool embed_index = false;    // bytes 0..7 of each image = little-endian global index (tests)
  StorageOptions storage;
};

PreparedDataset generate_synthetic(const SyntheticOptions& opt, const Communicator& comm);

// Language-model data (`prepare --dataset text|tokens`): one token stream
// whose last val_fraction goes to the "test" split (the validation set), each
// split one file "<name>-<split>.h5" holding /tokens (data/SCHEMA.md).
//  - text: `input` is a file, or a directory whose regular files (recursively,
//    in name order; symbolic links and binary files, those with a NUL byte,
//    skipped) are concatenated; the tokenizer is byte-level (vocab 256),
//    so the tokens are the file's bytes and decode back to them exactly;
//  - tokens: `input` is llm.c's .bin (a 256 x int32 header: magic 20240520,
//    version 1 (uint16 tokens) or 2 (uint32), token count; then the tokens) or
//    a .npy array of integers (any shape, C order, read flat). The vocabulary
//    is `vocab` when > 0, else the largest token + 1.
// Errors name the file: empty input, a token >= vocab, a bad header, a size
// that does not match the header, a split left empty.
enum class TokenSource { text, tokens };
struct TokenPrepareOptions {
  std::string input, output;
  TokenSource source = TokenSource::text;
  std::string name;            // "" = the input's file/directory name
  std::int64_t vocab = 0;      // tokens: 0 = from the data; text + sentencepiece: the model's size
  // text: "bytes" (vocab 256) or "sentencepiece": a model trained on the training split
  // (data/tokenizer.hpp), written as <output>/<name>.model; val_fraction is then of the bytes.
  std::string tokenizer = "bytes";
  double val_fraction = 0.1;   // of the tokens, taken from the end
  // "h5": ringtrain's files (above); "llmc": llm.c's token shards instead,
  // <output>/<name>_train.bin and <name>_val.bin (dev/data/data_common.py:
  // int32[256] header {20240520, 1 (uint16 tokens) or 2 (uint32, a vocabulary
  // over 65,536), count}, then the tokens), which llm.c trains on and
  // `prepare --dataset tokens` reads back.
  std::string format = "h5";
};
PreparedDataset prepare_tokens(const TokenPrepareOptions& opt, const Communicator& comm);

// The tokens of a pre-tokenised file (.bin or .npy, as above), checked
// against `vocab` when > 0. Throws Error naming the file.
std::vector<std::int32_t> read_token_file(const std::string& path, std::int64_t vocab = 0);
// Every token of a split's files, concatenated in shard order, each checked
// to be in [0, vocab) (errors name the file and the position).
std::vector<std::int32_t> read_split_tokens(const std::vector<FileInfo>& files);

}  // namespace ringtrain::data
