#include "store.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace ringtrain::data {

std::int64_t SampleStore::bytes_for(const std::vector<FileInfo>& infos, const std::vector<int>& shards) {
  std::int64_t n = 0;
  for (int s : shards) n += infos[s].count * infos[s].sample_bytes();
  return n;
}

SampleStore::SampleStore(const std::vector<FileInfo>& infos, const std::vector<int>& shards, bool cache, bool mpio,
                         const Communicator& comm)
    : infos_(infos), sb_(infos.front().sample_bytes()), cached_(cache), mpio_(mpio) {
  std::lock_guard lk(hdf5_mutex());
  h5::silence_errors();
  h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  dxpl_ = h5::Handle(H5Pcreate(H5P_DATASET_XFER));
  if (mpio) {
    RT_CHECK(infos.size() == 1, "MPI-IO collective reads need the single-file layout, got ", infos.size(), " files");
    io_comm_ = comm.dup("data-mpio");
    h5::check(H5Pset_fapl_mpio(fapl, io_comm_.handle("data loader MPI-IO"), MPI_INFO_NULL), infos[0].path,
              "H5Pset_fapl_mpio");
    h5::check(H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE), infos[0].path, "H5Pset_dxpl_mpio");
    // One MPI-IO call for all the chunks a read touches ("link chunk"), not one per chunk.
    h5::check(H5Pset_dxpl_mpio_chunk_opt(dxpl_, H5FD_MPIO_CHUNK_ONE_IO), infos[0].path, "H5Pset_dxpl_mpio_chunk_opt");
  }
  files_.resize(infos_.size());
  for (int s : shards) {
    auto f = std::make_unique<File>();
    f->info = &infos_[s];
    const std::string& path = f->info->path;
    f->file = h5::open_file(path, fapl);
    f->images = h5::Handle(h5::check_id(H5Dopen2(f->file, kImages, H5P_DEFAULT), path, "opening /images"));
    if (!cache) {
      // Chunk cache: uncompressed chunks are better read directly (only the selected
      // samples' bytes: caching would read a whole 256 KiB chunk per 784-byte image);
      // compressed chunks must be decoded whole, so keep many of them.
      h5::Handle dcpl(H5Dget_create_plist(f->images));
      bool filtered = H5Pget_nfilters(dcpl) > 0;
      hsize_t chunk[4] = {1, 1, 1, 1};
      if (H5Pget_layout(dcpl) == H5D_CHUNKED) H5Pget_chunk(dcpl, 4, chunk);
      union_reads_ = H5Pget_layout(dcpl) != H5D_CHUNKED || chunk[0] > 1;
      f->images.reset();  // an open handle would keep its cache settings for the reopen
      h5::Handle dapl(H5Pcreate(H5P_DATASET_ACCESS));
      H5Pset_chunk_cache(dapl, filtered ? 12421 : 0, filtered ? std::size_t(64) << 20 : 0, 1.0);
      f->images = h5::Handle(h5::check_id(H5Dopen2(f->file, kImages, dapl), path, "opening /images"));
    }
    h5::Handle lb(h5::check_id(H5Dopen2(f->file, kLabels, H5P_DEFAULT), path, "opening /labels"));
    f->labels.resize(f->info->count);
    h5::check(H5Dread(lb, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, mpio ? dxpl_.get() : H5P_DEFAULT, f->labels.data()),
              path, "reading /labels");
    for (std::int64_t i = 0; i < f->info->count; ++i)
      RT_CHECK(f->labels[i] >= 0 && f->labels[i] < f->info->num_classes, path, ": label out of range: sample ", i,
               " has label ", f->labels[i], " but the data set has ", f->info->num_classes, " classes");
    if (cache) {
      f->pixels.resize(std::size_t(f->info->count * sb_));
      h5::check(H5Dread(f->images, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, mpio ? dxpl_.get() : H5P_DEFAULT,
                        f->pixels.data()),
                path, "reading /images (truncated or corrupt data?)");
    }
    files_[s] = std::move(f);
  }
}

SampleStore::~SampleStore() {
  std::lock_guard lk(hdf5_mutex());
  files_.clear();  // H5Fclose: collective under MPI-IO, all ranks destroy their loaders
  dxpl_.reset();
}

const SampleStore::File& SampleStore::file_of(std::int64_t id, std::int64_t& local) const {
  // Shards are few; the last shard whose first_index <= id holds it.
  auto it = std::upper_bound(infos_.begin(), infos_.end(), id,
                             [](std::int64_t v, const FileInfo& f) { return v < f.first_index; });
  RT_ASSERT(it != infos_.begin());
  std::size_t s = std::size_t(it - infos_.begin() - 1);
  RT_CHECK(files_[s] != nullptr, "sample ", id, " is in shard ", s, ", which this rank did not open");
  local = id - infos_[s].first_index;
  return *files_[s];
}

SampleStore::File& SampleStore::file_of(std::int64_t id, std::int64_t& local) {
  return const_cast<File&>(static_cast<const SampleStore*>(this)->file_of(id, local));
}

std::int64_t SampleStore::label(std::int64_t id) const {
  std::int64_t local = 0;
  return file_of(id, local).labels[local];
}

void SampleStore::read(const std::int64_t* ids, std::int64_t n, std::uint8_t* dst) {
  if (cached_) {
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t local = 0;
      const File& f = file_of(ids[i], local);
      std::memcpy(dst + i * sb_, f.pixels.data() + local * sb_, std::size_t(sb_));
    }
    return;
  }
  std::lock_guard lk(hdf5_mutex());
  if (mpio_ && union_reads_) {
    read_union(ids, n, dst);
    return;
  }
  if (mpio_) {
    // Collective with one-image chunks (HDF5 1.10 handles unions over many chunks
    // very slowly): one call per batch position, b on every rank, so calls match.
    for (std::int64_t q = 0; q < n; ++q) read_run(ids[q], 1, dst + q * sb_);
    return;
  }
  // Independent: sort and dedupe, read each run of consecutive ids with one
  // H5Dread (a plain hyperslab: HDF5 1.10 reads a union of many hyperslabs ~70x
  // slower than the same samples read one by one), then scatter into batch order.
  uniq_.assign(ids, ids + n);
  std::sort(uniq_.begin(), uniq_.end());
  uniq_.erase(std::unique(uniq_.begin(), uniq_.end()), uniq_.end());
  scratch_.resize(uniq_.size() * std::size_t(sb_));
  for (std::size_t i = 0; i < uniq_.size();) {
    std::int64_t local = 0;
    const File& f = file_of(uniq_[i], local);
    const std::int64_t end_id = f.info->first_index + f.info->count;
    std::size_t k = i + 1;
    while (k < uniq_.size() && uniq_[k] == uniq_[k - 1] + 1 && uniq_[k] < end_id) ++k;
    read_run(uniq_[i], std::int64_t(k - i), scratch_.data() + i * sb_);
    i = k;
  }
  for (std::int64_t q = 0; q < n; ++q) {
    std::size_t at = std::size_t(std::lower_bound(uniq_.begin(), uniq_.end(), ids[q]) - uniq_.begin());
    std::memcpy(dst + q * sb_, scratch_.data() + at * sb_, std::size_t(sb_));
  }
}

// One collective H5Dread per batch: the union of the sorted unique ids' runs.
void SampleStore::read_union(const std::int64_t* ids, std::int64_t n, std::uint8_t* dst) {
  uniq_.assign(ids, ids + n);
  std::sort(uniq_.begin(), uniq_.end());
  uniq_.erase(std::unique(uniq_.begin(), uniq_.end()), uniq_.end());
  scratch_.resize(uniq_.size() * std::size_t(sb_));
  File& f = *files_[0];
  const std::string& path = f.info->path;
  h5::Handle fs(H5Dget_space(f.images));
  H5Sselect_none(fs);
  for (std::size_t i = 0; i < uniq_.size();) {
    std::size_t k = i + 1;
    while (k < uniq_.size() && uniq_[k] == uniq_[k - 1] + 1) ++k;
    hsize_t start[4] = {hsize_t(uniq_[i]), 0, 0, 0};
    hsize_t cnt[4] = {hsize_t(k - i), hsize_t(f.info->channels), hsize_t(f.info->height), hsize_t(f.info->width)};
    h5::check(H5Sselect_hyperslab(fs, H5S_SELECT_OR, start, nullptr, cnt, nullptr), path, "selecting samples");
    i = k;
  }
  hsize_t m[4] = {hsize_t(uniq_.size()), hsize_t(f.info->channels), hsize_t(f.info->height), hsize_t(f.info->width)};
  h5::Handle ms(H5Screate_simple(4, m, nullptr));
  h5::check(H5Dread(f.images, H5T_NATIVE_UINT8, ms, fs, dxpl_, scratch_.data()), path,
            "reading /images (collective; truncated or corrupt data?)");
  for (std::int64_t q = 0; q < n; ++q) {
    std::size_t at = std::size_t(std::lower_bound(uniq_.begin(), uniq_.end(), ids[q]) - uniq_.begin());
    std::memcpy(dst + q * sb_, scratch_.data() + at * sb_, std::size_t(sb_));
  }
}

void SampleStore::read_run(std::int64_t id, std::int64_t count, std::uint8_t* dst) {
  std::int64_t local = 0;
  File& f = file_of(id, local);
  const std::string& path = f.info->path;
  hsize_t start[4] = {hsize_t(local), 0, 0, 0};
  hsize_t cnt[4] = {hsize_t(count), hsize_t(f.info->channels), hsize_t(f.info->height), hsize_t(f.info->width)};
  h5::Handle fs(H5Dget_space(f.images));
  h5::check(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, cnt, nullptr), path, "selecting samples");
  h5::Handle ms(H5Screate_simple(4, cnt, nullptr));
  h5::check(H5Dread(f.images, H5T_NATIVE_UINT8, ms, fs, dxpl_, dst), path,
            cat("reading /images samples [", local, ", ", local + count, ") (truncated or corrupt data?)"));
}

}  // namespace ringtrain::data
