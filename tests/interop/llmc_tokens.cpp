// llm.c's token shards written by `prepare --format llmc` (data/prepare.hpp):
// byte for byte the file llm.c's own writer makes of the same tokens
// (dev/data/data_common.py's write_datafile, restated in numpy and run by
// /usr/bin/python3), for GPT-2's uint16 tokens (version 1) and a vocabulary
// over 65,536 (uint32, version 2); read back by `prepare --dataset tokens`
// token for token.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "ringtrain/data/prepare.hpp"
#include "support/error_of.hpp"
#include "support/numpy_files.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// llm.c's writer (data_common.py) on tokens.npy's first n_train and the rest.
const char* kReferenceWriter =
    "def write_datafile(filename, toks, model_desc):\n"
    "    assert len(toks) < 2**31\n"
    "    info = {'gpt-2': (20240520, 1, np.uint16), 'llama-3': (20240520, 2, np.uint32)}[model_desc]\n"
    "    header = np.zeros(256, dtype=np.int32)\n"
    "    header[0], header[1], header[2] = info[0], info[1], len(toks)\n"
    "    toks_np = np.array(toks, dtype=info[2])\n"
    "    with open(filename, 'wb') as f:\n"
    "        f.write(header.tobytes())\n"
    "        f.write(toks_np.tobytes())\n";

void check_against_reference(const fs::path& d, std::int64_t vocab, const char* model_desc) {
  // 1000 tokens spanning the vocabulary (its last id included); --val-fraction 0.1: the last 100 validate.
  test_support::python(d, std::string(kReferenceWriter) + "r = np.random.default_rng(7)\n"
                       "t = r.integers(0, " + std::to_string(vocab) + ", 1000); t[17] = " +
                       std::to_string(vocab - 1) + "\n"
                       "np.save('tokens.npy', t.astype(np.int64))\n"
                       "write_datafile('ref_train.bin', t[:900], '" + model_desc + "')\n"
                       "write_datafile('ref_val.bin', t[900:], '" + model_desc + "')\n");
  data::TokenPrepareOptions o;
  o.input = (d / "tokens.npy").string();
  o.output = (d / "out").string();
  o.source = data::TokenSource::tokens;
  o.vocab = vocab;
  o.format = "llmc";
  const data::PreparedDataset ds = data::prepare_tokens(o, Communicator());
  ASSERT_EQ(ds.train_files.front(), (d / "out" / "tokens_train.bin").string());
  ASSERT_EQ(ds.test_files.front(), (d / "out" / "tokens_val.bin").string());
  EXPECT_EQ(ds.train.count, 900);
  const std::string train = bytes_of(ds.train_files.front()), val = bytes_of(ds.test_files.front());
  EXPECT_EQ(train.size(), 1024 + 900 * (vocab <= 65536 ? 2 : 4));
  EXPECT_TRUE(train == bytes_of(d / "ref_train.bin")) << model_desc << ": the train shard differs from llm.c's";
  EXPECT_TRUE(val == bytes_of(d / "ref_val.bin")) << model_desc << ": the validation shard differs from llm.c's";

  // Read back: the tokens of the shards are the input's, in order.
  std::vector<std::int32_t> all = data::read_token_file(ds.train_files.front(), vocab);
  const std::vector<std::int32_t> v = data::read_token_file(ds.test_files.front(), vocab);
  all.insert(all.end(), v.begin(), v.end());
  EXPECT_EQ(all, data::read_token_file(o.input));
  // ...and through prepare --dataset tokens into ringtrain's files.
  data::TokenPrepareOptions back = o;
  back.input = ds.train_files.front();
  back.output = (d / "h5").string();
  back.format = "h5";
  const data::PreparedDataset h5 = data::prepare_tokens(back, Communicator());
  std::vector<std::int32_t> again = data::read_split_tokens({data::read_file_info(h5.train_files.front())});
  for (auto x : data::read_split_tokens({data::read_file_info(h5.test_files.front())})) again.push_back(x);
  EXPECT_EQ(again, std::vector<std::int32_t>(all.begin(), all.begin() + 900));
}

}  // namespace

TEST(LlmcTokens, Gpt2ShardsEqualLlmcsWriterAndReadBack) {
  const fs::path d = test_support::temp_dir("rt-llmc-tok", "gpt2");
  check_against_reference(d, 50257, "gpt-2");
  fs::remove_all(d);
}

TEST(LlmcTokens, LargeVocabularyShardsAreUint32LikeLlama3s) {
  const fs::path d = test_support::temp_dir("rt-llmc-tok", "llama3");
  check_against_reference(d, 128256, "llama-3");
  fs::remove_all(d);
}

TEST(LlmcTokens, TextIsWrittenAsShardsAndUnknownFormatsAreRefused) {
  const fs::path d = test_support::temp_dir("rt-llmc-tok", "text");
  std::ofstream(d / "corpus.txt", std::ios::binary) << std::string(400, 'a') + "bcd";
  data::TokenPrepareOptions o;
  o.input = (d / "corpus.txt").string();
  o.output = (d / "out").string();
  o.format = "llmc";
  o.val_fraction = 0.25;
  const data::PreparedDataset ds = data::prepare_tokens(o, Communicator());
  EXPECT_EQ(ds.train.vocab, 256);
  std::vector<std::int32_t> all = data::read_token_file(ds.train_files.front());
  for (auto x : data::read_token_file(ds.test_files.front())) all.push_back(x);
  EXPECT_EQ(std::string(all.begin(), all.end()), std::string(400, 'a') + "bcd");
  o.format = "bin";
  const std::string e = test_support::error_of([&] { data::prepare_tokens(o, Communicator()); });
  EXPECT_NE(e.find("prepare --format 'bin' is not known"), std::string::npos) << e;
  fs::remove_all(d);
}
