#include "message.hpp"

#include <cstring>
#include <functional>

#include "ringtrain/core/error.hpp"

namespace ringtrain::engine {
namespace {

class Writer {
 public:
  template <typename T>
  void put(T v) {
    auto p = reinterpret_cast<const std::uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void sig(const Signature& s) {
    put<std::uint8_t>(static_cast<std::uint8_t>(s.dtype));
    put<std::uint8_t>(static_cast<std::uint8_t>(s.op));
    put<std::uint8_t>(static_cast<std::uint8_t>(s.device));
    put<std::uint32_t>(static_cast<std::uint32_t>(s.shape.size()));
    for (auto d : s.shape) put<std::int64_t>(d);
  }
  std::vector<std::uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<std::uint8_t> buf_;
};

class Reader {
 public:
  Reader(const std::uint8_t* d, std::size_t n, const char* what) : d_(d), n_(n), what_(what) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str() {
    auto len = get<std::uint32_t>();
    need(len);
    std::string s(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len;
    return s;
  }
  Signature sig() {
    Signature s;
    s.dtype = static_cast<DType>(get<std::uint8_t>());
    s.op = static_cast<ReduceOp>(get<std::uint8_t>());
    s.device = static_cast<DeviceKind>(get<std::uint8_t>());
    auto nd = get<std::uint32_t>();
    need(std::size_t{nd} * 8);
    s.shape.resize(nd);
    for (auto& d : s.shape) d = get<std::int64_t>();
    return s;
  }
  bool done() const { return pos_ == n_; }

 private:
  void need(std::size_t k) {
    RT_CHECK(pos_ + k <= n_, "fusion engine: truncated ", what_, " (", n_, " bytes, needed ", pos_ + k, ")");
  }
  const std::uint8_t* d_;
  std::size_t n_, pos_ = 0;
  const char* what_;
};

}  // namespace

std::vector<std::uint8_t> encode(const RankMessage& m) {
  Writer w;
  w.put<std::uint32_t>(static_cast<std::uint32_t>(m.cache_bits.size()));
  for (auto b : m.cache_bits) w.put<std::uint64_t>(b);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(m.requests.size()));
  for (const auto& r : m.requests) {
    w.str(r.name);
    w.sig(r.sig);
  }
  return w.take();
}

RankMessage decode_rank_message(const std::uint8_t* data, std::size_t n) {
  Reader r(data, n, "request message");
  RankMessage m;
  m.cache_bits.resize(r.get<std::uint32_t>());
  for (auto& b : m.cache_bits) b = r.get<std::uint64_t>();
  m.requests.resize(r.get<std::uint32_t>());
  for (auto& q : m.requests) {
    q.name = r.str();
    q.sig = r.sig();
  }
  RT_CHECK(r.done(), "fusion engine: trailing bytes in a request message");
  return m;
}

std::vector<std::uint8_t> encode(const std::vector<Response>& rs) {
  Writer w;
  w.put<std::uint32_t>(static_cast<std::uint32_t>(rs.size()));
  for (const auto& r : rs) {
    w.put<std::uint8_t>(static_cast<std::uint8_t>(r.type));
    w.str(r.name);
    w.sig(r.sig);
    w.str(r.message);
  }
  return w.take();
}

std::vector<Response> decode_responses(const std::uint8_t* data, std::size_t n) {
  Reader r(data, n, "response message");
  std::vector<Response> rs(r.get<std::uint32_t>());
  for (auto& x : rs) {
    x.type = static_cast<ResponseType>(r.get<std::uint8_t>());
    x.name = r.str();
    x.sig = r.sig();
    x.message = r.str();
  }
  RT_CHECK(r.done(), "fusion engine: trailing bytes in a response message");
  return rs;
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ranks[i]);
  }
  return s;
}

const char* device_kind_name(DeviceKind k) { return k == DeviceKind::cpu ? "cpu" : "cuda"; }

namespace {
// Groups ranks by the value `key` gives, in order of first appearance; empty
// when every rank has the same value.
std::string aspect(const std::vector<Signature>& per_rank, const char* what,
                   const std::function<std::string(const Signature&)>& key) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
    std::string v = key(per_rank[r]);
    auto it = groups.begin();
    while (it != groups.end() && it->first != v) ++it;
    if (it == groups.end()) groups.push_back({v, {r}});
    else it->second.push_back(r);
  }
  if (groups.size() <= 1) return "";
  std::string s = cat(what, " mismatch: ");
  for (std::size_t i = 0; i < groups.size(); ++i)
    s += cat(i ? ", " : "", ranks_str(groups[i].second), " submitted ", groups[i].first);
  return s;
}
}  // namespace

std::string mismatch_message(const std::string& name, const std::vector<Signature>& per_rank) {
  std::string parts[] = {
      aspect(per_rank, "dtype", [](const Signature& s) { return std::string(dtype_name(s.dtype)); }),
      aspect(per_rank, "shape", [](const Signature& s) { return shape_str(s.shape); }),
      aspect(per_rank, "op", [](const Signature& s) { return std::string(op_name(s.op)); }),
      aspect(per_rank, "device", [](const Signature& s) { return std::string(device_kind_name(s.device)); }),
  };
  std::string msg;
  for (auto& p : parts)
    if (!p.empty()) msg += (msg.empty() ? "" : "; ") + p;
  if (msg.empty()) return "";
  return cat("allreduce '", name, "': ", msg);
}

}  // namespace ringtrain::engine
