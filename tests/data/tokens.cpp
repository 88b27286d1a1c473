// Language-model data: a text prepared with the byte tokenizer stores exactly
// the file's bytes (train then validation); llm.c .bin and NumPy .npy token
// files (written here by /usr/bin/python3 with numpy) are read token for
// token; bad headers, empty files, tokens outside the vocabulary and a
// sequence longer than the data are refused with errors naming the file; the
// loader's windows are the stream's tokens with next-token targets, the same
// for every (epoch, position) and split by rank as the 1-rank batch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ringtrain/data/loader.hpp"
#include "ringtrain/data/prepare.hpp"
#include "support/error_of.hpp"
#include "support/numpy_files.hpp"

using namespace ringtrain;
using test_support::error_of;
using test_support::python;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) { return test_support::temp_dir("rt-tok", tag); }

std::vector<std::int32_t> tokens_of(const std::string& path) {
  return data::read_split_tokens({data::read_file_info(path)});
}

data::PreparedDataset prepare(const fs::path& in, const fs::path& out, data::TokenSource src, double val = 0.25,
                              std::int64_t vocab = 0) {
  data::TokenPrepareOptions o;
  o.input = in.string();
  o.output = out.string();
  o.source = src;
  o.val_fraction = val;
  o.vocab = vocab;
  return data::prepare_tokens(o, Communicator());
}

}  // namespace

TEST(Tokens, TextRoundTripsByteForByte) {
  const fs::path d = temp_dir("text");
  std::string text = "It was the best of times.\nUTF-8: h\xc3\xa9llo \xe2\x9c\x93, \x01\x7f\xff bytes.\n";
  for (int i = 0; i < 5; ++i) text += text;
  std::ofstream(d / "corpus.txt", std::ios::binary) << text;
  const auto ds = prepare(d / "corpus.txt", d / "out", data::TokenSource::text);
  EXPECT_EQ(ds.train.vocab, 256);
  EXPECT_EQ(ds.train.tokenizer, "bytes");
  std::vector<std::int32_t> all = tokens_of(ds.train_files[0]);
  const std::vector<std::int32_t> val = tokens_of(ds.test_files[0]);
  EXPECT_EQ(val.size(), text.size() / 4);  // --val-fraction 0.25, from the end
  all.insert(all.end(), val.begin(), val.end());
  std::string back(all.begin(), all.end());  // each token is one byte
  EXPECT_EQ(back, text);
}

TEST(Tokens, DirectoryConcatenatesTextFilesAndSkipsBinaryAndLinks) {
  const fs::path d = temp_dir("dir");
  fs::create_directories(d / "in" / "sub");
  std::ofstream(d / "in" / "b.txt") << "bbbbbbbbbb";
  std::ofstream(d / "in" / "sub" / "c") << "cccccccccc";
  std::ofstream(d / "in" / "a.dat", std::ios::binary) << std::string("x\0y", 3);  // binary: skipped
  fs::create_symlink(d / "in" / "b.txt", d / "in" / "link");                       // a link: skipped
  const auto ds = prepare(d / "in", d / "out", data::TokenSource::text, 0.5);
  std::vector<std::int32_t> all = tokens_of(ds.train_files[0]);
  for (auto t : tokens_of(ds.test_files[0])) all.push_back(t);
  EXPECT_EQ(std::string(all.begin(), all.end()), "bbbbbbbbbbcccccccccc");  // b.txt, then sub/c
}

TEST(Tokens, LlmcBinAndNpyAreReadTokenForToken) {
  const fs::path d = temp_dir("bin");
  python(d, "r = np.random.default_rng(5); t = r.integers(0, 50257, 1000).astype(np.uint16)\n"
            "h = np.zeros(256, np.int32); h[0] = 20240520; h[1] = 1; h[2] = len(t)\n"
            "open('gpt2.bin', 'wb').write(h.tobytes() + t.tobytes())\n"
            "np.save('gpt2.npy', t.astype(np.int64)); np.save('small.npy', t[:100].astype(np.int32).reshape(10, 10))\n"
            "t.astype(np.int32).tofile('expected.raw')\n");
  std::vector<std::int32_t> want(1000);
  std::ifstream(d / "expected.raw", std::ios::binary).read(reinterpret_cast<char*>(want.data()), 4000);
  EXPECT_EQ(data::read_token_file((d / "gpt2.bin").string()), want);
  EXPECT_EQ(data::read_token_file((d / "gpt2.npy").string()), want);
  EXPECT_EQ(data::read_token_file((d / "small.npy").string()),
            std::vector<std::int32_t>(want.begin(), want.begin() + 100));  // [10, 10] read flat
  const auto ds = prepare(d / "gpt2.bin", d / "out", data::TokenSource::tokens, 0.1, 50257);
  EXPECT_EQ(ds.train.vocab, 50257);
  std::vector<std::int32_t> all = tokens_of(ds.train_files[0]);
  for (auto t : tokens_of(ds.test_files[0])) all.push_back(t);
  EXPECT_EQ(all, want);
  // Without --vocab: the largest token + 1.
  const auto ds2 = prepare(d / "gpt2.npy", d / "out2", data::TokenSource::tokens, 0.1);
  EXPECT_EQ(ds2.train.vocab, *std::max_element(want.begin(), want.end()) + 1);
}

TEST(Tokens, BadFilesAreRefusedNamingTheFile) {
  const fs::path d = temp_dir("bad");
  python(d, "t = np.arange(10, dtype=np.uint16)\n"
            "def w(name, magic, version, n, payload):\n"
            "  h = np.zeros(256, np.int32); h[0] = magic; h[1] = version; h[2] = n\n"
            "  open(name, 'wb').write(h.tobytes() + payload)\n"
            "w('magic.bin', 20240521, 1, 10, t.tobytes()); w('version.bin', 20240520, 7, 10, t.tobytes())\n"
            "w('short.bin', 20240520, 1, 11, t.tobytes())\n"
            "open('empty.bin', 'wb').close(); open('empty.txt', 'wb').close(); open('header.bin', 'wb').write(b'abc')\n"
            "np.save('float.npy', np.zeros(4, np.float32)); np.save('neg.npy', np.array([1, -2], np.int32))\n");
  auto err = [&](const char* f, std::int64_t vocab = 0) {
    return error_of([&] { data::read_token_file((d / f).string(), vocab); });
  };
  EXPECT_NE(err("magic.bin").find("magic.bin: header magic 20240521 is not llm.c's 20240520"), std::string::npos)
      << err("magic.bin");
  EXPECT_NE(err("version.bin").find("version.bin: header version 7"), std::string::npos) << err("version.bin");
  EXPECT_NE(err("short.bin").find("short.bin: the header says 11 tokens (22 bytes) but 20 bytes follow"),
            std::string::npos) << err("short.bin");
  EXPECT_NE(err("empty.bin").find("empty.bin: the file is empty"), std::string::npos) << err("empty.bin");
  EXPECT_NE(err("header.bin").find("header.bin: 3 bytes, shorter than llm.c's"), std::string::npos);
  EXPECT_NE(err("float.npy").find("float.npy: dtype '<f4' is not an integer type"), std::string::npos) << err("float.npy");
  EXPECT_NE(err("neg.npy").find("neg.npy: token 1 = -2"), std::string::npos) << err("neg.npy");
  EXPECT_NE(err("magic.bin", 0).find("magic"), std::string::npos);
  python(d, "h = np.zeros(256, np.int32); h[0] = 20240520; h[1] = 1; h[2] = 3\n"
            "open('ok.bin', 'wb').write(h.tobytes() + np.array([1, 9, 2], np.uint16).tobytes())\n");
  EXPECT_NE(err("ok.bin", 5).find("ok.bin: token 1 = 9 is not in the vocabulary [0, 5)"), std::string::npos)
      << err("ok.bin", 5);
  const std::string empty = error_of([&] { prepare(d / "empty.txt", d / "o1", data::TokenSource::text); });
  EXPECT_NE(empty.find("empty.txt: the text is empty"), std::string::npos) << empty;
}

TEST(Tokens, LoaderServesWindowsWithNextTokenTargets) {
  const fs::path d = temp_dir("loader");
  std::string text;
  for (int i = 0; i < 400; ++i) text += char('a' + (i * 7) % 26);
  std::ofstream(d / "t.txt") << text;
  const auto ds = prepare(d / "t.txt", d / "out", data::TokenSource::text, 0.25);
  const std::vector<std::int32_t> stream = tokens_of(ds.train_files[0]);  // 300 tokens
  const std::int64_t T = 16, windows = (300 - 1) / T;
  data::LoaderOptions o;
  o.files = ds.train_files;
  o.batch_size = 3;
  o.seq_len = T;
  o.seed = 11;
  auto epoch = [&](data::Loader& l, std::vector<std::int64_t>& ids) {
    std::vector<float> x;
    while (auto b = l.next()) {
      EXPECT_EQ(b->images.shape(), (Shape{3, T}));
      EXPECT_EQ(b->labels.shape(), (Shape{3, T}));
      for (std::int64_t i = 0; i < 3; ++i) {
        const std::int64_t id = (*b->ids)[std::size_t(i)];
        ids.push_back(id);
        for (std::int64_t j = 0; j < T; ++j) {
          ASSERT_EQ(b->images.data<float>()[i * T + j], float(stream[std::size_t(id * T + j)]));
          ASSERT_EQ(b->labels.data<std::int64_t>()[i * T + j], stream[std::size_t(id * T + j + 1)]);
        }
      }
    }
  };
  std::vector<std::int64_t> a, b, c;
  {
    data::Loader l(o, Communicator());
    EXPECT_EQ(l.num_samples(), windows);
    epoch(l, a);
    epoch(l, c);  // epoch 1: another permutation
  }
  {
    data::Loader l(o, Communicator());
    epoch(l, b);
  }
  EXPECT_EQ(a, b);  // the same (seed, epoch) gives the same windows
  EXPECT_NE(a, c);
  std::vector<std::int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(std::int64_t(sorted.size()), windows);  // the tail pads by wrapping: every window is served
  // A sequence longer than the data is refused naming the file.
  o.seq_len = 300;
  const std::string e = error_of([&] { data::Loader l(o, Communicator()); });
  EXPECT_NE(e.find("t-train.h5: data.seq_len = 300 is longer than the data (300 tokens"), std::string::npos) << e;
  o.seq_len = 0;
  const std::string e2 = error_of([&] { data::Loader l(o, Communicator()); });
  EXPECT_NE(e2.find("needs the sequence length (data.seq_len)"), std::string::npos) << e2;
}
