#pragma once
// ShardWriter: writes one schema file (data/SCHEMA.md) through a temporary name
// and renames it into place on commit(); a writer destroyed before commit()
// removes its temporary file. Holds hdf5_mutex() for every HDF5 call.
#include <cstdint>
#include <string>

#include "h5.hpp"
#include "ringtrain/data/schema.hpp"

namespace ringtrain::data {

class ShardWriter {
 public:
  // meta.count samples of meta.{channels,height,width}; chunk_samples 0 = automatic.
  ShardWriter(std::string final_path, const FileInfo& meta, int chunk_samples, int deflate);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Rows [begin, begin + n) of this file.
  void write(std::int64_t begin, std::int64_t n, const std::uint8_t* pixels, const std::int64_t* labels);
  void set_stats(const std::vector<double>& mean, const std::vector<double>& std);
  void commit();
  const std::string& path() const { return final_; }

  static std::int64_t auto_chunk(std::int64_t sample_bytes, std::int64_t count);

 private:
  std::string final_, tmp_;
  FileInfo meta_;
  h5::Handle file_, images_, labels_;
  bool committed_ = false;
};

}  // namespace ringtrain::data
