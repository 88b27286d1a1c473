// prepare_dataset: raw IDX / CIFAR-10 -> schema files (see prepare.hpp).
#include "ringtrain/data/prepare.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <tuple>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/data/sources.hpp"
#include "h5.hpp"
#include "writer.hpp"

namespace ringtrain::data {
namespace {
namespace fs = std::filesystem;

const std::vector<std::string> kFashionClasses = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                  "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
const std::vector<std::string> kCifarClasses = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                "dog",      "frog",       "horse", "ship", "truck"};

// "<dir>/<base>" or "<dir>/<base>.gz", whichever exists ("" when neither).
std::string find_raw(const std::string& dir, const std::string& base) {
  std::error_code ec;
  for (std::string n : {base, base + ".gz"})
    if (fs::is_regular_file(fs::path(dir) / n, ec)) return (fs::path(dir) / n).string();
  return "";
}

std::string need_raw(const std::string& dir, const std::string& given, const std::string& standard) {
  if (!given.empty()) return fs::path(given).is_absolute() ? given : (fs::path(dir) / given).string();
  std::string p = find_raw(dir, standard);
  RT_CHECK(!p.empty(), dir, ": missing ", standard, "[.gz]");
  return p;
}

SourceFormat detect(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec) && dir.ends_with(".npz")) return SourceFormat::npz;
  RT_CHECK(fs::is_directory(dir, ec), dir, ": input directory not found");
  if (!find_raw(dir, "train-images-idx3-ubyte").empty()) return SourceFormat::idx;
  if (!find_raw(dir, "data_batch_1.bin").empty()) return SourceFormat::cifar10;
  if (fs::is_directory(fs::path(dir) / "train", ec) && fs::is_directory(fs::path(dir) / "test", ec))
    return SourceFormat::images;
  RT_FAIL(dir, ": cannot tell the format: no train-images-idx3-ubyte[.gz] (MNIST-style IDX) and no data_batch_1.bin ",
          "(CIFAR-10 binary); give the IDX file names explicitly");
}

struct Splits {
  ImageSet train, test;
  std::string name;
  std::vector<std::string> classes;
};

Splits load(const PrepareOptions& o) {
  Splits s;
  SourceFormat fmt = o.format == SourceFormat::auto_detect && o.train_images.empty() ? detect(o.input) : o.format;
  if (fmt == SourceFormat::auto_detect) fmt = SourceFormat::idx;
  if (fmt == SourceFormat::idx) {
    s.train = read_idx_pair(need_raw(o.input, o.train_images, "train-images-idx3-ubyte"),
                            need_raw(o.input, o.train_labels, "train-labels-idx1-ubyte"));
    s.test = read_idx_pair(need_raw(o.input, o.test_images, "t10k-images-idx3-ubyte"),
                           need_raw(o.input, o.test_labels, "t10k-labels-idx1-ubyte"));
    std::string dir = fs::absolute(o.input).string();
    bool fashion = dir.find("fashion") != std::string::npos;
    s.name = fashion ? "fashion-mnist" : "mnist";
    if (fashion) s.classes = kFashionClasses;
  } else if (fmt == SourceFormat::npz) {
    std::tie(s.train, s.test) = read_npz(o.input);
    s.name = fs::path(o.input).stem().string();
  } else if (fmt == SourceFormat::images) {
    s.train = read_image_folders((fs::path(o.input) / "train").string(), s.classes);
    s.test = read_image_folders((fs::path(o.input) / "test").string(), s.classes);
    s.train.sources = {fs::absolute(o.input).string() + "/train"};  // not every file name: a folder may hold many
    s.test.sources = {fs::absolute(o.input).string() + "/test"};
    s.name = fs::absolute(o.input).lexically_normal().filename().string();
    if (s.name.empty()) s.name = fs::absolute(o.input).lexically_normal().parent_path().filename().string();
  } else {
    std::vector<std::string> train;
    for (int i = 1; i <= 5; ++i) train.push_back(need_raw(o.input, "", cat("data_batch_", i, ".bin")));
    s.train = read_cifar10(train);
    s.test = read_cifar10({need_raw(o.input, "", "test_batch.bin")});
    s.name = "cifar10";
    s.classes = kCifarClasses;
  }
  RT_CHECK(s.train.channels == s.test.channels && s.train.height == s.test.height && s.train.width == s.test.width,
           o.input, ": train images are ", s.train.channels, "x", s.train.height, "x", s.train.width,
           " but test images are ", s.test.channels, "x", s.test.height, "x", s.test.width);
  if (!o.name.empty()) s.name = o.name;
  if (!o.class_names.empty()) s.classes = o.class_names;
  if (s.classes.empty()) {
    std::int64_t k = 0;
    for (auto* set : {&s.train, &s.test})
      for (auto l : set->labels) k = std::max(k, l + 1);
    for (std::int64_t i = 0; i < k; ++i) s.classes.push_back(std::to_string(i));
  }
  for (auto* set : {&s.train, &s.test})
    for (std::int64_t i = 0; i < set->count; ++i)
      RT_CHECK(set->labels[i] < std::int64_t(s.classes.size()), set->sources.back(), ": label ", set->labels[i],
               " of sample ", i, " is out of range (", s.classes.size(), " classes)");
  return s;
}

// Per-channel mean/std of pixels/255, exact (integer sums).
void channel_stats(const ImageSet& s, std::vector<double>& mean, std::vector<double>& std) {
  std::int64_t plane = s.height * s.width;
  mean.assign(s.channels, 0);
  std.assign(s.channels, 0);
  for (std::int64_t c = 0; c < s.channels; ++c) {
    std::int64_t sum = 0, sq = 0;
    for (std::int64_t i = 0; i < s.count; ++i) {
      const std::uint8_t* p = s.pixels.data() + (i * s.channels + c) * plane;
      std::int64_t a = 0, b = 0;
      for (std::int64_t j = 0; j < plane; ++j) {
        a += p[j];
        b += std::int64_t(p[j]) * p[j];
      }
      sum += a;
      sq += b;
    }
    double n = double(s.count) * double(plane);
    double m = double(sum) / n;
    mean[c] = m / 255.0;
    std[c] = std::sqrt(std::max(0.0, double(sq) / n - m * m)) / 255.0;
    if (std[c] <= 0) std[c] = 1.0;  // a constant channel: normalisation only shifts it
  }
}

}  // namespace

PreparedDataset prepare_dataset(const PrepareOptions& o, const Communicator& comm) {
  PreparedDataset out;
  const int p = comm.valid() ? comm.size() : 1, rank = comm.valid() ? comm.rank() : 0;
  run_agreed(comm, "prepare", [&] {
    RT_CHECK(!o.output.empty(), "prepare: no output directory given");
    Splits s = load(o);
    std::vector<double> mean, std;
    channel_stats(s.train, mean, std);
    std::error_code ec;
    fs::create_directories(o.output, ec);
    RT_CHECK(fs::is_directory(o.output, ec), o.output, ": cannot create the output directory");
    for (auto [split, set] : {std::pair{"train", &s.train}, std::pair{"test", &s.test}}) {
      int k = o.storage.num_shards == 0 ? p : o.storage.num_shards;
      RT_CHECK(k >= 1 && k <= set->count, "prepare: ", k, " shards for ", set->count, " ", split, " samples");
      auto& files = std::string(split) == "train" ? out.train_files : out.test_files;
      for (int sh = 0; sh < k; ++sh) {
        std::string path = (fs::path(o.output) / shard_file_name(s.name, split, sh, k)).string();
        files.push_back(path);
        if (sh % p != rank) continue;
        std::int64_t b = set->count * sh / k, e = set->count * (sh + 1) / k;
        FileInfo m;
        m.name = s.name;
        m.split = split;
        m.count = e - b;
        m.channels = set->channels, m.height = set->height, m.width = set->width;
        m.num_classes = std::int64_t(s.classes.size());
        m.class_names = s.classes;
        m.mean = mean, m.std = std;
        m.source_files = set->sources;
        m.shard_index = sh, m.num_shards = k, m.first_index = b, m.total_count = set->count;
        ShardWriter w(path, m, o.storage.chunk_samples, o.storage.deflate);
        w.write(0, e - b, set->pixels.data() + b * m.sample_bytes(), set->labels.data() + b);
        w.commit();
      }
    }
  });
  if (comm.valid()) comm.barrier();  // every file is in place before anyone reads
  out.train = read_file_info(out.train_files.front());
  return out;
}

}  // namespace ringtrain::data

namespace ringtrain::data {
namespace {

// Every label of one file in [0, num_classes) (the loader would fail mid-run otherwise).
void check_labels(const FileInfo& f, const std::string& path) {
  std::vector<std::int64_t> y(static_cast<std::size_t>(f.count));
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::Handle file = h5::open_file(path);
    h5::Handle d(h5::check_id(H5Dopen2(file.get(), "labels", H5P_DEFAULT), path, "open /labels"));
    h5::check(H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data()), path, "read /labels");
  }
  for (std::size_t i = 0; i < y.size(); ++i)
    RT_CHECK(y[i] >= 0 && y[i] < f.num_classes, path, ": label ", y[i], " of sample ", i, " is out of range [0, ",
             f.num_classes, ")");
}

}  // namespace

std::string check_prepared(const std::string& dir) {
  if (read_file_info(find_split_files(dir, "train").front()).tokens()) {  // token files: every token < vocab
    std::string summary;
    for (const char* split : {"train", "test"}) {
      std::vector<FileInfo> infos;
      for (const auto& f : find_split_files(dir, split)) infos.push_back(read_file_info(f));
      RT_CHECK(infos.front().tokens() && infos.front().split == split, infos.front().path,
               ": not a token file of split '", split, "'");
      summary += cat(summary.empty() ? "" : ", ", split, " ", read_split_tokens(infos).size(), " tokens");
    }
    return cat(dir, ": ok: ", summary, ", vocabulary ", read_file_info(find_split_files(dir, "train").front()).vocab);
  }
  std::string summary;
  FileInfo first;
  for (const char* split : {"train", "test"}) {
    const std::vector<std::string> files = find_split_files(dir, split);
    std::int64_t next = 0;
    for (std::size_t i = 0; i < files.size(); ++i) {
      const FileInfo f = read_file_info(files[i]);  // attributes, datasets, shapes, dtypes
      check_labels(f, files[i]);
      if (summary.empty() && i == 0) first = f;
      RT_CHECK(f.split == split, files[i], ": attribute split = '", f.split, "', expected '", split, "'");
      RT_CHECK(f.channels == first.channels && f.height == first.height && f.width == first.width, files[i],
               ": images are ", f.channels, "x", f.height, "x", f.width, " but ", files.front(), " has ",
               first.channels, "x", first.height, "x", first.width);
      RT_CHECK(f.num_classes == first.num_classes, files[i], ": num_classes = ", f.num_classes, " but the train "
               "split has ", first.num_classes);
      RT_CHECK(f.num_shards == std::int64_t(files.size()) && f.shard_index == std::int64_t(i), files[i],
               ": shard_index/num_shards = ", f.shard_index, "/", f.num_shards, ", but it is file ", i, " of ",
               files.size(), " of split '", split, "'");
      RT_CHECK(f.first_index == next, files[i], ": first_index = ", f.first_index, ", expected ", next,
               " (the shards must cover the split in order)");
      next += f.count;
      RT_CHECK(f.total_count == (i + 1 == files.size() ? next : f.total_count) && next <= f.total_count, files[i],
               ": total_count = ", f.total_count, " but the shards hold ", next, " samples");
    }
    summary += cat(summary.empty() ? "" : ", ", split, " ", next, " samples in ", files.size(), " file(s)");
  }
  return cat(dir, ": ok: ", summary, ", images ", first.channels, "x", first.height, "x", first.width, ", ",
             first.num_classes, " classes");
}

}  // namespace ringtrain::data
