#include "writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace ringtrain::data {

std::int64_t ShardWriter::auto_chunk(std::int64_t sample_bytes, std::int64_t count) {
  std::int64_t c = std::max<std::int64_t>(1, (256 << 10) / std::max<std::int64_t>(1, sample_bytes));
  return std::max<std::int64_t>(1, std::min(c, count));
}

ShardWriter::ShardWriter(std::string final_path, const FileInfo& meta, int chunk_samples, int deflate)
    : final_(std::move(final_path)), meta_(meta) {
  RT_CHECK(deflate >= 0 && deflate <= 9, final_, ": deflate level ", deflate, " is not 0..9");
  RT_CHECK(meta.count > 0, final_, ": a data file needs at least one sample");
  tmp_ = cat(final_, ".tmp-", ::getpid());
  std::lock_guard lk(hdf5_mutex());
  file_ = h5::create_file(tmp_);
  const std::string& f = tmp_;
  hsize_t dims[4] = {hsize_t(meta.count), hsize_t(meta.channels), hsize_t(meta.height), hsize_t(meta.width)};
  std::int64_t chunk = chunk_samples > 0 ? std::min<std::int64_t>(chunk_samples, meta.count)
                                         : auto_chunk(meta.sample_bytes(), meta.count);
  hsize_t cdims[4] = {hsize_t(chunk), dims[1], dims[2], dims[3]};
  h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  // chunk_samples < 0: contiguous layout (no chunk index: the fastest layout for
  // MPI-IO collective reads of scattered samples; cannot be compressed).
  RT_CHECK(chunk_samples >= 0 || deflate == 0, final_, ": a contiguous (unchunked) layout cannot be compressed");
  if (chunk_samples >= 0) h5::check(H5Pset_chunk(dcpl, 4, cdims), f, "setting the chunk shape");
  if (deflate > 0) {
    h5::check(H5Pset_shuffle(dcpl), f, "enabling the shuffle filter");
    h5::check(H5Pset_deflate(dcpl, unsigned(deflate)), f, "enabling deflate");
  }
  h5::Handle space(H5Screate_simple(4, dims, nullptr));
  images_ = h5::Handle(h5::check_id(
      H5Dcreate2(file_, kImages, H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), f, "creating /images"));
  hsize_t n = hsize_t(meta.count);
  h5::Handle lspace(H5Screate_simple(1, &n, nullptr));
  labels_ = h5::Handle(h5::check_id(
      H5Dcreate2(file_, kLabels, H5T_STD_I64LE, lspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), f,
      "creating /labels"));
  h5::write_attr_i64(file_, "schema_version", kSchemaVersion, f);
  h5::write_attr_str(file_, "name", meta.name, f);
  h5::write_attr_str(file_, "split", meta.split, f);
  h5::write_attr_str(file_, "layout", "NCHW", f);
  h5::write_attr_i64(file_, "num_classes", meta.num_classes, f);
  h5::write_attr_strs(file_, "class_names", meta.class_names, f);
  h5::write_attr_strs(file_, "source_files", meta.source_files, f);
  h5::write_attr_i64(file_, "shard_index", meta.shard_index, f);
  h5::write_attr_i64(file_, "num_shards", meta.num_shards, f);
  h5::write_attr_i64(file_, "first_index", meta.first_index, f);
  h5::write_attr_i64(file_, "total_count", meta.total_count, f);
  h5::write_attr_f64s(file_, "mean", meta.mean, f);
  h5::write_attr_f64s(file_, "std", meta.std, f);
}

ShardWriter::~ShardWriter() {
  if (committed_) return;
  {
    std::lock_guard lk(hdf5_mutex());
    images_.reset();
    labels_.reset();
    file_.reset();
  }
  std::remove(tmp_.c_str());
}

void ShardWriter::write(std::int64_t begin, std::int64_t n, const std::uint8_t* pixels, const std::int64_t* labels) {
  RT_CHECK(begin >= 0 && n > 0 && begin + n <= meta_.count, tmp_, ": rows [", begin, ", ", begin + n,
           ") outside the file's ", meta_.count, " samples");
  std::lock_guard lk(hdf5_mutex());
  hsize_t start[4] = {hsize_t(begin), 0, 0, 0};
  hsize_t count[4] = {hsize_t(n), hsize_t(meta_.channels), hsize_t(meta_.height), hsize_t(meta_.width)};
  h5::Handle fs(H5Dget_space(images_));
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr);
  h5::Handle ms(H5Screate_simple(4, count, nullptr));
  h5::check(H5Dwrite(images_, H5T_NATIVE_UINT8, ms, fs, H5P_DEFAULT, pixels), tmp_, "writing /images");
  h5::Handle lfs(H5Dget_space(labels_));
  H5Sselect_hyperslab(lfs, H5S_SELECT_SET, start, nullptr, count, nullptr);
  h5::Handle lms(H5Screate_simple(1, count, nullptr));
  h5::check(H5Dwrite(labels_, H5T_NATIVE_INT64, lms, lfs, H5P_DEFAULT, labels), tmp_, "writing /labels");
}

void ShardWriter::set_stats(const std::vector<double>& mean, const std::vector<double>& std) {
  std::lock_guard lk(hdf5_mutex());
  h5::write_attr_f64s(file_, "mean", mean, tmp_);
  h5::write_attr_f64s(file_, "std", std, tmp_);
}

void ShardWriter::commit() {
  {
    std::lock_guard lk(hdf5_mutex());
    images_.reset();
    labels_.reset();
    h5::check(H5Fflush(file_, H5F_SCOPE_GLOBAL), tmp_, "flushing");
    file_.reset();
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, final_, ec);
  RT_CHECK(!ec, final_, ": cannot rename the finished file into place from ", tmp_, " (", ec.message(), ")");
  committed_ = true;
}

}  // namespace ringtrain::data
