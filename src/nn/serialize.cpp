// Model::save/load: a small self-describing binary format. Layout (little endian):
//   "RTPARAM1" | u64 count | count x { u32 name_len, name, u8 dtype, u32 ndim,
//   i64 dims[ndim], u64 nbytes, raw bytes }  -- parameters, then buffers.
// Loading checks count, every name, dtype and shape, and copies bytes exactly.
#include <cstring>
#include <fstream>
#include <istream>
#include <ostream>
#include <vector>

#include "ringtrain/nn/model.hpp"

namespace ringtrain {
namespace {

constexpr char kMagic[8] = {'R', 'T', 'P', 'A', 'R', 'A', 'M', '1'};

template <typename T>
void put(std::ostream& os, T v) {
  os.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T get(std::istream& is, const std::string& what) {
  T v{};
  is.read(reinterpret_cast<char*>(&v), sizeof(T));
  RT_CHECK(is.good(), "parameter file truncated while reading ", what);
  return v;
}

std::vector<NamedBuffer> everything(const Model& m) {
  std::vector<NamedBuffer> all;
  const auto& a = m.arena();
  for (std::size_t i = 0; i < a.size(); ++i) all.push_back({a.info(i).name, a.param(i), a.info(i).shard});
  for (auto& b : m.buffers()) all.push_back(b);
  return all;
}

}  // namespace

void Model::save(std::ostream& os) const {
  RT_CHECK(finalized_, "model '", name_, "': save() before finalize()");
  auto all = everything(*this);
  os.write(kMagic, 8);
  put<std::uint64_t>(os, all.size());
  std::vector<char> host;
  for (auto& [name, t, shard] : all) {
    put<std::uint32_t>(os, static_cast<std::uint32_t>(name.size()));
    os.write(name.data(), static_cast<std::streamsize>(name.size()));
    put<std::uint8_t>(os, static_cast<std::uint8_t>(t.dtype()));
    put<std::uint32_t>(os, static_cast<std::uint32_t>(t.ndim()));
    for (auto d : t.shape()) put<std::int64_t>(os, d);
    put<std::uint64_t>(os, t.nbytes());
    host.resize(t.nbytes());
    Tensor::wrap(host.data(), t.shape(), t.dtype()).copy_from(t);
    os.write(host.data(), static_cast<std::streamsize>(host.size()));
  }
  RT_CHECK(os.good(), "model '", name_, "': writing parameters failed");
}

void Model::load(std::istream& is) {
  RT_CHECK(finalized_, "model '", name_, "': load() before finalize()");
  char magic[8];
  is.read(magic, 8);
  RT_CHECK(is.good() && std::memcmp(magic, kMagic, 8) == 0, "not a ringtrain parameter file (bad magic)");
  auto all = everything(*this);
  auto count = get<std::uint64_t>(is, "the tensor count");
  RT_CHECK(count == all.size(), "parameter file holds ", count, " tensors, model '", name_, "' has ", all.size());
  std::vector<char> host;
  for (auto& [name, t, shard] : all) {
    auto len = get<std::uint32_t>(is, "a name length");
    RT_CHECK(len < 4096, "parameter file: implausible name length ", len);
    std::string got(len, '\0');
    is.read(got.data(), len);
    RT_CHECK(is.good() && got == name, "parameter file: expected tensor '", name, "', found '", got, "'");
    auto dt = get<std::uint8_t>(is, name);
    RT_CHECK(dt == static_cast<std::uint8_t>(t.dtype()), "parameter file: '", name, "' has another dtype");
    auto nd = get<std::uint32_t>(is, name);
    RT_CHECK(nd == static_cast<std::uint32_t>(t.ndim()), "parameter file: '", name, "' has ", nd, " dims, expected ",
             t.ndim());
    Shape s(nd);
    for (auto& d : s) d = get<std::int64_t>(is, name);
    RT_CHECK(s == t.shape(), "parameter file: '", name, "' has shape ", shape_str(s), ", model expects ",
             shape_str(t.shape()));
    auto nb = get<std::uint64_t>(is, name);
    RT_CHECK(nb == t.nbytes(), "parameter file: '", name, "' byte count mismatch");
    host.resize(nb);
    is.read(host.data(), static_cast<std::streamsize>(nb));
    RT_CHECK(is.good(), "parameter file truncated inside '", name, "'");
    t.copy_from(Tensor::wrap(host.data(), t.shape(), t.dtype()));
  }
}

void Model::save(const std::string& path) const {
  std::ofstream os(path, std::ios::binary);
  RT_CHECK(os.is_open(), "cannot open '", path, "' for writing");
  save(os);
}

void Model::load(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  RT_CHECK(is.is_open(), "cannot open parameter file '", path, "'");
  load(is);
}

}  // namespace ringtrain
