#include "ringtrain/data/schema.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "h5.hpp"

namespace ringtrain::data {

std::mutex& hdf5_mutex() {
  // The one process-wide object here: HDF5 itself is process-global and not thread-safe.
  static std::mutex mu;
  return mu;
}

std::string shard_file_name(const std::string& name, const std::string& split, int shard, int k) {
  if (k == 1) return cat(name, "-", split, ".h5");
  char buf[48];
  std::snprintf(buf, sizeof buf, "-%05d-of-%05d.h5", shard, k);
  return cat(name, "-", split, buf);
}

namespace {

// The attributes every file has (shards, split, name), checked alike.
void read_common(hid_t f, const std::string& path, FileInfo& info) {
  info.schema_version = int(h5::read_attr_i64(f, "schema_version", path));
  RT_CHECK(info.schema_version >= 1 && info.schema_version <= kSchemaVersion, path, ": schema_version ",
           info.schema_version, " is not supported (this build reads 1..", kSchemaVersion, ")");
  info.name = h5::read_attr_str(f, "name", path);
  info.split = h5::read_attr_str(f, "split", path);
  info.source_files = h5::has_attr(f, "source_files") ? h5::read_attr_strs(f, "source_files", path)
                                                       : std::vector<std::string>{};
  info.shard_index = h5::read_attr_i64(f, "shard_index", path);
  info.num_shards = h5::read_attr_i64(f, "num_shards", path);
  info.first_index = h5::read_attr_i64(f, "first_index", path);
  info.total_count = h5::read_attr_i64(f, "total_count", path);
  RT_CHECK(info.num_shards >= 1 && info.shard_index >= 0 && info.shard_index < info.num_shards, path, ": shard_index ",
           info.shard_index, " / num_shards ", info.num_shards, " are inconsistent");
  RT_CHECK(info.first_index >= 0 && info.first_index + info.count <= info.total_count, path, ": samples [",
           info.first_index, ", ", info.first_index + info.count, ") exceed total_count ", info.total_count);
}

// A token file: /tokens [n] integers, attributes vocab and tokenizer. The
// image fields describe one token (1x1x1, mean 0, std 1) so code that
// compares image shapes treats two token files alike.
FileInfo read_token_info(hid_t f, const std::string& path) {
  FileInfo info;
  info.path = path;
  h5::Handle d(h5::check_id(H5Dopen2(f, kTokens, H5P_DEFAULT), path, "opening /tokens"));
  auto dims = h5::dims_of(d, path, kTokens);
  RT_CHECK(dims.size() == 1, path, ": /tokens must have rank 1 [n], has rank ", dims.size());
  RT_CHECK(dims[0] > 0, path, ": /tokens is empty");
  h5::Handle t(H5Dget_type(d));
  RT_CHECK(H5Tget_class(t) == H5T_INTEGER, path, ": /tokens has the wrong dtype (must be an integer type)");
  info.count = std::int64_t(dims[0]);
  info.channels = info.height = info.width = 1;
  info.mean = {0.0};
  info.std = {1.0};
  info.vocab = h5::read_attr_i64(f, "vocab", path);
  RT_CHECK(info.vocab >= 2, path, ": vocab ", info.vocab, " must be >= 2");
  info.num_classes = info.vocab;
  info.tokenizer = h5::read_attr_str(f, "tokenizer", path);
  read_common(f, path, info);
  return info;
}

}  // namespace

FileInfo read_file_info(const std::string& path) {
  std::lock_guard lk(hdf5_mutex());
  h5::Handle f = h5::open_file(path);
  FileInfo info;
  info.path = path;
  if (H5Lexists(f, kTokens, H5P_DEFAULT) > 0) return read_token_info(f, path);
  for (const char* ds : {kImages, kLabels})
    RT_CHECK(H5Lexists(f, ds, H5P_DEFAULT) > 0, path, ": dataset /", ds, " is missing");
  h5::Handle im(h5::check_id(H5Dopen2(f, kImages, H5P_DEFAULT), path, "opening /images"));
  h5::Handle lb(h5::check_id(H5Dopen2(f, kLabels, H5P_DEFAULT), path, "opening /labels"));
  auto d = h5::dims_of(im, path, kImages);
  RT_CHECK(d.size() == 4, path, ": /images must have rank 4 [N,C,H,W], has rank ", d.size());
  auto l = h5::dims_of(lb, path, kLabels);
  RT_CHECK(l.size() == 1, path, ": /labels must have rank 1 [N], has rank ", l.size());
  RT_CHECK(d[0] == l[0], path, ": image/label count mismatch: /images has ", d[0], " samples, /labels has ", l[0]);
  RT_CHECK(d[0] > 0 && d[1] > 0 && d[2] > 0 && d[3] > 0, path, ": /images has an empty dimension");
  {
    h5::Handle t(H5Dget_type(im));
    RT_CHECK(H5Tget_class(t) == H5T_INTEGER && H5Tget_size(t) == 1 && H5Tget_sign(t) == H5T_SGN_NONE, path,
             ": /images has the wrong dtype (must be uint8)");
    h5::Handle u(H5Dget_type(lb));
    RT_CHECK(H5Tget_class(u) == H5T_INTEGER, path, ": /labels has the wrong dtype (must be an integer type, int64 written)");
  }
  info.count = std::int64_t(d[0]);
  info.channels = std::int64_t(d[1]);
  info.height = std::int64_t(d[2]);
  info.width = std::int64_t(d[3]);
  read_common(f, path, info);
  info.num_classes = h5::read_attr_i64(f, "num_classes", path);
  RT_CHECK(info.num_classes >= 1, path, ": num_classes ", info.num_classes, " must be >= 1");
  info.class_names = h5::read_attr_strs(f, "class_names", path);
  RT_CHECK(info.class_names.empty() || std::int64_t(info.class_names.size()) == info.num_classes, path,
           ": class_names has ", info.class_names.size(), " entries for ", info.num_classes, " classes");
  info.mean = h5::read_attr_f64s(f, "mean", path);
  info.std = h5::read_attr_f64s(f, "std", path);
  RT_CHECK(std::int64_t(info.mean.size()) == info.channels && std::int64_t(info.std.size()) == info.channels, path,
           ": mean/std must have one value per channel (", info.channels, "), have ", info.mean.size(), "/",
           info.std.size());
  for (double s : info.std) RT_CHECK(s > 0, path, ": std attribute has a non-positive entry ", s);
  return info;
}

std::vector<std::string> find_split_files(const std::string& dir_or_file, const std::string& split) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(dir_or_file, ec)) return {dir_or_file};
  RT_CHECK(fs::is_directory(dir_or_file, ec), dir_or_file, ": no such data file or directory");
  std::vector<std::string> single, shards;
  const std::regex single_re(".*-" + split + "\\.h5");
  const std::regex shard_re(".*-" + split + "-[0-9]{5}-of-[0-9]{5}\\.h5");
  for (const auto& e : fs::directory_iterator(dir_or_file, ec)) {
    std::string n = e.path().filename().string();
    if (std::regex_match(n, shard_re)) shards.push_back(e.path().string());
    else if (std::regex_match(n, single_re)) single.push_back(e.path().string());
  }
  std::sort(shards.begin(), shards.end());
  RT_CHECK(!(single.empty() && shards.empty()), dir_or_file, ": no '*-", split, ".h5' or '*-", split,
           "-NNNNN-of-KKKKK.h5' files (run `ringtrain prepare` first)");
  RT_CHECK(single.size() + (shards.empty() ? 0 : 1) == 1, dir_or_file, ": several data sets for split '", split,
           "' in one directory; pass the file (or a directory holding one data set)");
  return shards.empty() ? single : shards;
}

}  // namespace ringtrain::data
