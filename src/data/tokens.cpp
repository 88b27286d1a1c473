// Language-model data: text and pre-tokenised streams to token files
// (prepare.hpp), and the tokens of a prepared split for the loader.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "h5.hpp"
#include "ringtrain/comm/agree.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/data/sources.hpp"
#include "ringtrain/data/tokenizer.hpp"

namespace ringtrain::data {
namespace {
namespace fs = std::filesystem;

constexpr std::int32_t kLlmcMagic = 20240520;

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RT_CHECK(in.good(), path, ": cannot open");
  std::vector<std::uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RT_CHECK(!in.bad(), path, ": read error");
  return b;
}

// llm.c's token file: header[0] magic, [1] version, [2] token count, 256 int32 in all.
std::vector<std::int32_t> read_llmc(const std::string& path) {
  const std::vector<std::uint8_t> b = read_bytes(path);
  RT_CHECK(!b.empty(), path, ": the file is empty");
  RT_CHECK(b.size() >= 256 * 4, path, ": ", b.size(), " bytes, shorter than llm.c's 1024-byte header");
  std::int32_t h[3];
  std::memcpy(h, b.data(), sizeof h);
  RT_CHECK(h[0] == kLlmcMagic, path, ": header magic ", h[0], " is not llm.c's ", kLlmcMagic,
           " (not an llm.c token file)");
  RT_CHECK(h[1] == 1 || h[1] == 2, path, ": header version ", h[1], " is not supported (1: uint16 tokens, "
           "2: uint32 tokens)");
  const std::size_t item = h[1] == 1 ? 2 : 4;
  RT_CHECK(h[2] > 0, path, ": the header says ", h[2], " tokens (the file holds none)");
  RT_CHECK(b.size() - 1024 == std::size_t(h[2]) * item, path, ": the header says ", h[2], " tokens (",
           std::size_t(h[2]) * item, " bytes) but ", b.size() - 1024, " bytes follow it");
  std::vector<std::int32_t> t(static_cast<std::size_t>(h[2]));
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (item == 2) {
      std::uint16_t v;
      std::memcpy(&v, b.data() + 1024 + 2 * i, 2);
      t[i] = v;
    } else {
      std::uint32_t v;
      std::memcpy(&v, b.data() + 1024 + 4 * i, 4);
      RT_CHECK(v <= 0x7fffffffu, path, ": token ", i, " = ", v, " is too large");
      t[i] = std::int32_t(v);
    }
  }
  return t;
}

std::vector<std::int32_t> read_npy_tokens(const std::string& path) {
  const std::vector<std::uint8_t> b = read_bytes(path);
  RT_CHECK(!b.empty(), path, ": the file is empty");
  const Npy n = parse_npy(b, path);
  const char kind = n.descr.size() >= 2 ? n.descr[1] : '?';
  const std::size_t item = std::size_t(std::stoi(n.descr.substr(2)));
  RT_CHECK((kind == 'i' || kind == 'u') && (item == 1 || item == 2 || item == 4 || item == 8), path, ": dtype '",
           n.descr, "' is not an integer type");
  const std::size_t count = n.bytes.size() / item;
  RT_CHECK(count > 0, path, ": the array is empty");
  std::vector<std::int32_t> t(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t v = 0;
    const std::uint8_t* p = n.bytes.data() + i * item;
    if (kind == 'u') {
      std::uint64_t u = 0;
      std::memcpy(&u, p, item);  // little-endian host (the .npy says '<')
      RT_CHECK(u <= 0x7fffffffu, path, ": token ", i, " = ", u, " is too large");
      v = std::int64_t(u);
    } else {
      if (item == 1) v = std::int8_t(p[0]);
      else if (item == 2) v = std::int16_t(p[0] | (p[1] << 8));
      else if (item == 4) { std::int32_t x; std::memcpy(&x, p, 4); v = x; }
      else std::memcpy(&v, p, 8);
      RT_CHECK(v >= 0 && v <= 0x7fffffff, path, ": token ", i, " = ", v, " is not in [0, 2^31)");
    }
    t[i] = std::int32_t(v);
  }
  return t;
}

// A text file, or a directory's regular text files (recursively, in path
// order; symbolic links and files holding a NUL byte are skipped).
std::vector<std::int32_t> read_text(const std::string& input, std::vector<std::string>& sources) {
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(input, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(input, ec))  // links: each file once
      if (!e.is_symlink(ec) && e.is_regular_file(ec)) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    RT_CHECK(!files.empty(), input, ": the directory holds no files");
  } else {
    RT_CHECK(fs::is_regular_file(input, ec), input, ": no such file or directory");
    files.push_back(input);
  }
  const bool dir = files.size() > 1 || files.front() != input;
  std::vector<std::int32_t> t;
  for (const auto& f : files) {
    const std::vector<std::uint8_t> b = read_bytes(f);
    // In a directory, binary files (a NUL byte: indexes such as fortune's .dat) are not text.
    if (dir && std::find(b.begin(), b.end(), std::uint8_t(0)) != b.end()) continue;
    t.insert(t.end(), b.begin(), b.end());  // byte-level tokenizer: token = byte
    sources.push_back(fs::absolute(f).string());
  }
  RT_CHECK(!t.empty(), input, ": the text is empty", dir ? " (no text files: binary ones are skipped)" : "");
  return t;
}

void check_vocab(const std::vector<std::int32_t>& t, std::int64_t vocab, const std::string& path,
                 std::int64_t first = 0) {
  for (std::size_t i = 0; i < t.size(); ++i)
    RT_CHECK(t[i] >= 0 && t[i] < vocab, path, ": token ", first + std::int64_t(i), " = ", t[i],
             " is not in the vocabulary [0, ", vocab, ")");
}

void write_token_file(const std::string& path, const FileInfo& m, const std::int32_t* t) {
  const std::string tmp = cat(path, ".tmp-", ::getpid());
  {
    std::lock_guard lk(hdf5_mutex());
    h5::Handle f = h5::create_file(tmp);
    hsize_t n = hsize_t(m.count);
    h5::Handle space(H5Screate_simple(1, &n, nullptr));
    // uint16 as llm.c stores GPT-2's tokens; int32 for larger vocabularies.
    const hid_t type = m.vocab <= 65536 ? H5T_STD_U16LE : H5T_STD_I32LE;
    h5::Handle d(h5::check_id(H5Dcreate2(f, kTokens, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), tmp,
                              "creating /tokens"));
    h5::check(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, t), tmp, "writing /tokens");
    h5::write_attr_i64(f, "schema_version", kSchemaVersion, tmp);
    h5::write_attr_str(f, "name", m.name, tmp);
    h5::write_attr_str(f, "split", m.split, tmp);
    h5::write_attr_i64(f, "vocab", m.vocab, tmp);
    h5::write_attr_str(f, "tokenizer", m.tokenizer, tmp);
    h5::write_attr_strs(f, "source_files", m.source_files, tmp);
    h5::write_attr_i64(f, "shard_index", 0, tmp);
    h5::write_attr_i64(f, "num_shards", 1, tmp);
    h5::write_attr_i64(f, "first_index", 0, tmp);
    h5::write_attr_i64(f, "total_count", m.count, tmp);
    d.reset();
    h5::check(H5Fflush(f, H5F_SCOPE_GLOBAL), tmp, "flushing");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) std::remove(tmp.c_str());
  RT_CHECK(!ec, path, ": cannot rename the finished file into place from ", tmp, " (", ec.message(), ")");
}

// llm.c's token shard (dev/data/data_common.py's write_datafile): int32[256]
// header {20240520, version, count}, then the tokens as uint16 (version 1,
// GPT-2's) when every token fits, else uint32 (version 2, Llama 3's).
void write_llmc(const std::string& path, const std::int32_t* t, std::int64_t n, std::int64_t vocab) {
  RT_CHECK(n < (std::int64_t{1} << 31), path, ": ", n, " tokens exceed llm.c's limit of 2^31 - 1 per file");
  const int version = vocab <= 65536 ? 1 : 2;
  std::int32_t head[256] = {};
  head[0] = kLlmcMagic;
  head[1] = version;
  head[2] = static_cast<std::int32_t>(n);
  std::string bytes(reinterpret_cast<const char*>(head), sizeof head);
  const std::size_t item = version == 1 ? 2 : 4;
  bytes.resize(sizeof head + static_cast<std::size_t>(n) * item);
  char* out = bytes.data() + sizeof head;
  for (std::int64_t i = 0; i < n; ++i) {  // little-endian host, as numpy's tobytes() there
    if (version == 1) {
      const auto v = static_cast<std::uint16_t>(t[i]);
      std::memcpy(out + 2 * i, &v, 2);
    } else {
      const auto v = static_cast<std::uint32_t>(t[i]);
      std::memcpy(out + 4 * i, &v, 4);
    }
  }
  const std::string tmp = cat(path, ".tmp-", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f.good()) std::remove(tmp.c_str());
    RT_CHECK(f.good(), path, ": cannot write ", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) std::remove(tmp.c_str());
  RT_CHECK(!ec, path, ": cannot rename the finished file into place from ", tmp, " (", ec.message(), ")");
}

// One split in the chosen format: ringtrain's HDF5 or llm.c's shard.
void write_split(const TokenPrepareOptions& o, const std::string& path, const FileInfo& m, const std::int32_t* t) {
  if (o.format == "llmc") write_llmc(path, t, m.count, m.vocab);
  else write_token_file(path, m, t);
}

// Text under a SentencePiece model trained on its training split (the first 1 - val_fraction
// of the bytes, cut at a character boundary), written to <output>/<name>.model; both splits encoded.
std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> sentencepiece_splits(const TokenPrepareOptions& o,
                                                                                     const std::string& name,
                                                                                     FileInfo& m) {
  RT_CHECK(o.vocab > 0, "prepare --tokenizer sentencepiece: give the vocabulary size (--vocab-size V)");
  const std::vector<std::int32_t> bytes = read_text(o.input, m.source_files);
  const std::string text(bytes.begin(), bytes.end());
  auto cut = static_cast<std::size_t>(double(text.size()) * (1 - o.val_fraction));
  while (cut > 0 && (std::uint8_t(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  RT_CHECK(cut >= 2 && text.size() - cut >= 2, o.input, ": ", text.size(), " bytes split at --val-fraction ",
           o.val_fraction, " leave too little text for a split");
  std::error_code ec;
  fs::create_directories(o.output, ec);
  RT_CHECK(fs::is_directory(o.output, ec), o.output, ": cannot create the output directory");
  const std::string model = (fs::path(o.output) / (name + ".model")).string();
  {
    const std::string proto = train_sentencepiece(text.substr(0, cut), o.vocab, o.input);
    const std::string tmp = cat(model, ".tmp-", ::getpid());
    std::ofstream f(tmp, std::ios::binary);
    f.write(proto.data(), std::streamsize(proto.size()));
    f.close();
    RT_CHECK(f.good(), tmp, ": cannot write the sentencepiece model");
    fs::rename(tmp, model, ec);
    RT_CHECK(!ec, model, ": cannot rename the model into place (", ec.message(), ")");
  }
  const SentencePiece sp(model);
  m.vocab = sp.vocab();
  m.tokenizer = "sentencepiece";
  return {sp.encode(text.substr(0, cut)), sp.encode(text.substr(cut))};
}

}  // namespace

std::vector<std::int32_t> read_token_file(const std::string& path, std::int64_t vocab) {
  std::error_code ec;
  RT_CHECK(fs::is_regular_file(path, ec), path, ": no such file");
  std::vector<std::int32_t> t;
  if (path.ends_with(".npy")) t = read_npy_tokens(path);
  else if (path.ends_with(".bin")) t = read_llmc(path);
  else RT_FAIL(path, ": unknown token file type (llm.c .bin or NumPy .npy)");
  if (vocab > 0) check_vocab(t, vocab, path);
  return t;
}

PreparedDataset prepare_tokens(const TokenPrepareOptions& o, const Communicator& comm) {
  PreparedDataset out;
  const int rank = comm.valid() ? comm.rank() : 0;
  std::string name = o.name;
  if (name.empty()) name = fs::path(o.input).lexically_normal().filename().stem().string();
  if (name.empty()) name = fs::absolute(o.input).lexically_normal().parent_path().filename().string();
  const bool llmc = o.format == "llmc";  // llm.c's names: <name>_train.bin, <name>_val.bin
  out.train_files = {(fs::path(o.output) / (llmc ? name + "_train.bin" : shard_file_name(name, "train", 0, 1))).string()};
  out.test_files = {(fs::path(o.output) / (llmc ? name + "_val.bin" : shard_file_name(name, "test", 0, 1))).string()};
  run_agreed(comm, "prepare", [&] {
    RT_CHECK(!o.output.empty(), "prepare: no output directory given");
    RT_CHECK(o.format == "h5" || o.format == "llmc", "prepare --format '", o.format,
             "' is not known (h5: ringtrain's HDF5; llmc: llm.c's token shards, for --dataset text or tokens)");
    RT_CHECK(o.val_fraction > 0 && o.val_fraction < 1, "prepare: --val-fraction ", o.val_fraction,
             " must be in (0, 1)");
    if (rank != 0) return;  // one writer: two small files
    FileInfo m;
    m.name = name;
    std::vector<std::int32_t> t;
    RT_CHECK(o.tokenizer == "bytes" || (o.tokenizer == "sentencepiece" && o.source == TokenSource::text),
             "prepare: --tokenizer '", o.tokenizer, "' is not known (bytes, or sentencepiece for --dataset text)");
    if (o.tokenizer == "sentencepiece") {
      const auto [train, test] = sentencepiece_splits(o, name, m);
      m.split = "train";
      m.count = m.total_count = std::int64_t(train.size());
      write_split(o, out.train_files[0], m, train.data());
      m.split = "test";
      m.count = m.total_count = std::int64_t(test.size());
      write_split(o, out.test_files[0], m, test.data());
      return;
    }
    if (o.source == TokenSource::text) {
      RT_CHECK(o.vocab == 0 || o.vocab == 256, "prepare --dataset text: the byte tokenizer's vocabulary is 256, "
               "not --vocab ", o.vocab);
      t = read_text(o.input, m.source_files);
      m.vocab = 256;
      m.tokenizer = "bytes";
    } else {
      t = read_token_file(o.input, o.vocab);
      m.source_files = {fs::absolute(o.input).string()};
      m.vocab = o.vocab > 0 ? o.vocab : std::int64_t(*std::max_element(t.begin(), t.end())) + 1;
      m.vocab = std::max<std::int64_t>(m.vocab, 2);
      m.tokenizer = "external";
    }
    const auto n = std::int64_t(t.size());
    const auto val = static_cast<std::int64_t>(double(n) * o.val_fraction);
    RT_CHECK(val >= 2 && n - val >= 2, o.input, ": ", n, " tokens split at --val-fraction ", o.val_fraction,
             " leave ", n - val, " for training and ", val, " for validation (each needs at least 2)");
    std::error_code ec;
    fs::create_directories(o.output, ec);
    RT_CHECK(fs::is_directory(o.output, ec), o.output, ": cannot create the output directory");
    m.split = "train";
    m.count = m.total_count = n - val;
    write_split(o, out.train_files[0], m, t.data());
    m.split = "test";
    m.count = m.total_count = val;
    write_split(o, out.test_files[0], m, t.data() + (n - val));
  });
  if (comm.valid()) comm.barrier();  // every file is in place before anyone reads
  if (llmc) {  // no attributes in llm.c's file: the split as the options and its tokens say
    const std::vector<std::int32_t> t = read_token_file(out.train_files.front());
    FileInfo& f = out.train;
    f.name = name;
    f.split = "train";
    f.path = out.train_files.front();
    f.count = f.total_count = static_cast<std::int64_t>(t.size());
    f.tokenizer = o.source == TokenSource::text ? o.tokenizer : "external";
    f.vocab = o.source == TokenSource::text && o.tokenizer == "bytes" ? 256
              : o.vocab > 0 ? o.vocab
                            : std::max<std::int64_t>(2, *std::max_element(t.begin(), t.end()) + 1);
    return out;
  }
  out.train = read_file_info(out.train_files.front());
  return out;
}

std::vector<std::int32_t> read_split_tokens(const std::vector<FileInfo>& files) {
  std::vector<std::int32_t> all;
  for (const FileInfo& f : files) {
    RT_CHECK(f.tokens(), f.path, ": not a token file (no /tokens)");
    std::vector<std::int32_t> t(std::size_t(f.count));
    {
      std::lock_guard lk(hdf5_mutex());
      h5::Handle file = h5::open_file(f.path);
      h5::Handle d(h5::check_id(H5Dopen2(file, kTokens, H5P_DEFAULT), f.path, "opening /tokens"));
      h5::check(H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data()), f.path,
                "reading /tokens (truncated or corrupt data?)");
    }
    check_vocab(t, f.vocab, f.path, f.first_index);
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

}  // namespace ringtrain::data
