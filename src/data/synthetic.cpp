// generate_synthetic: learnable synthetic shards (see prepare.hpp).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numbers>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/agree.hpp"
#include "ringtrain/data/prepare.hpp"
#include "rng.hpp"
#include "writer.hpp"

namespace ringtrain::data {
namespace {

// Class k's mean image is base_c + row_c(y) + col_c(x): separable, so 1000
// classes of 224x224 cost only (H + W) floats per channel and class.
struct Patterns {
  std::int64_t C, H, W;
  std::vector<float> base, row, col;  // [K,C], [K,C,H], [K,C,W]
  Patterns(std::int64_t K, std::int64_t C_, std::int64_t H_, std::int64_t W_, std::uint64_t seed)
      : C(C_), H(H_), W(W_), base(K * C_), row(K * C_ * H_), col(K * C_ * W_) {
    constexpr double tau = 2 * std::numbers::pi;
    for (std::int64_t k = 0; k < K; ++k) {
      std::uint64_t s = mix_seed(seed, 0xc1a55, std::uint64_t(k));
      for (std::int64_t c = 0; c < C; ++c) {
        auto u = [&] { return double(splitmix64(s) >> 11) / 9007199254740992.0; };
        base[k * C + c] = float(80 + 96 * u());
        double fy = 1 + std::floor(3 * u()), fx = 1 + std::floor(3 * u()), py = tau * u(), px = tau * u();
        for (std::int64_t y = 0; y < H; ++y) row[(k * C + c) * H + y] = float(36 * std::sin(tau * fy * y / H + py));
        for (std::int64_t x = 0; x < W; ++x) col[(k * C + c) * W + x] = float(36 * std::sin(tau * fx * x / W + px));
      }
    }
  }
};

std::int64_t make_sample(const Patterns& P, const SyntheticOptions& o, std::int64_t index, bool test,
                         std::uint8_t* out) {
  std::uint64_t s = mix_seed(o.seed, test ? 2 : 1, std::uint64_t(index));
  auto draw = [&] { return splitmix64(s); };
  std::int64_t label = std::int64_t(uniform_below(draw, std::uint64_t(o.num_classes)));
  const int amp = std::clamp(o.noise, 0, 255);
  std::uint64_t bits = 0;
  int left = 0;
  for (std::int64_t c = 0; c < P.C; ++c) {
    const float b = P.base[label * P.C + c];
    const float* row = &P.row[(label * P.C + c) * P.H];
    const float* col = &P.col[(label * P.C + c) * P.W];
    for (std::int64_t y = 0; y < P.H; ++y) {
      for (std::int64_t x = 0; x < P.W; ++x) {
        if (left == 0) bits = splitmix64(s), left = 8;
        int noise = int(((bits & 0xff) * std::uint64_t(2 * amp + 1)) >> 8) - amp;
        bits >>= 8, --left;
        int v = int(b + row[y] + col[x]) + noise;
        *out++ = std::uint8_t(std::clamp(v, 0, 255));
      }
    }
  }
  return label;
}

}  // namespace

PreparedDataset generate_synthetic(const SyntheticOptions& o, const Communicator& comm) {
  namespace fs = std::filesystem;
  PreparedDataset out;
  const int p = comm.valid() ? comm.size() : 1, rank = comm.valid() ? comm.rank() : 0;
  std::vector<std::unique_ptr<ShardWriter>> mine;
  std::vector<double> sums(2 * std::max<std::int64_t>(o.channels, 1), 0.0);
  run_agreed(comm, "synthetic", [&] {
    RT_CHECK(!o.output.empty(), "synthetic: no output directory given");
    RT_CHECK(o.channels > 0 && o.height > 0 && o.width > 0, "synthetic: image shape ", o.channels, "x", o.height, "x",
             o.width, " must be positive");
    RT_CHECK(o.num_classes >= 1 && o.train_samples >= 1 && o.test_samples >= 0,
             "synthetic: need >= 1 class and >= 1 train sample");
    RT_CHECK(!o.embed_index || o.channels * o.height * o.width >= 8, "synthetic: embed_index needs >= 8 pixels");
    std::error_code ec;
    fs::create_directories(o.output, ec);
    RT_CHECK(fs::is_directory(o.output, ec), o.output, ": cannot create the output directory");
    Patterns P(o.num_classes, o.channels, o.height, o.width, o.seed);
    const std::int64_t sb = o.channels * o.height * o.width, plane = o.height * o.width;
    const std::int64_t block = std::max<std::int64_t>(1, (32 << 20) / sb);  // 32 MiB of pixels per write
    std::vector<std::uint8_t> pix(block * sb);
    std::vector<std::int64_t> lab(block);
    std::vector<std::string> classes;
    for (std::int64_t k = 0; k < o.num_classes; ++k) classes.push_back(cat("class", k));
    for (bool test : {false, true}) {
      const std::int64_t n = test ? o.test_samples : o.train_samples;
      if (n == 0) continue;
      const char* split = test ? "test" : "train";
      int k = o.storage.num_shards == 0 ? p : o.storage.num_shards;
      RT_CHECK(k >= 1 && k <= n, "synthetic: ", k, " shards for ", n, " ", split, " samples");
      for (int sh = 0; sh < k; ++sh) {
        std::string path = (fs::path(o.output) / shard_file_name(o.name, split, sh, k)).string();
        (test ? out.test_files : out.train_files).push_back(path);
        if (sh % p != rank) continue;
        std::int64_t b = n * sh / k, e = n * (sh + 1) / k;
        FileInfo m;
        m.name = o.name, m.split = split, m.count = e - b;
        m.channels = o.channels, m.height = o.height, m.width = o.width;
        m.num_classes = o.num_classes, m.class_names = classes;
        m.mean.assign(o.channels, 0.5), m.std.assign(o.channels, 0.25);  // replaced by set_stats below
        m.source_files = {cat("synthetic(seed=", o.seed, ", noise=", o.noise, ")")};
        m.shard_index = sh, m.num_shards = k, m.first_index = b, m.total_count = n;
        auto w = std::make_unique<ShardWriter>(path, m, o.storage.chunk_samples, o.storage.deflate);
        for (std::int64_t i = b; i < e; i += block) {
          std::int64_t cnt = std::min(block, e - i);
          for (std::int64_t j = 0; j < cnt; ++j) {
            std::uint8_t* img = pix.data() + j * sb;
            lab[j] = make_sample(P, o, i + j, test, img);
            if (o.embed_index)
              for (int q = 0; q < 8; ++q) img[q] = std::uint8_t(std::uint64_t(i + j) >> (8 * q));
            if (test) continue;
            for (std::int64_t c = 0; c < o.channels; ++c) {
              std::uint64_t a = 0, s2 = 0;
              for (std::int64_t t = 0; t < plane; ++t) {
                std::uint64_t v = img[c * plane + t];
                a += v, s2 += v * v;
              }
              sums[2 * c] += double(a), sums[2 * c + 1] += double(s2);
            }
          }
          w->write(i - b, cnt, pix.data(), lab.data());
        }
        mine.push_back(std::move(w));
      }
    }
  });
  // Exact train statistics: reduce the per-rank sums, then stamp them into every file before the rename.
  if (comm.valid() && p > 1)
    bounded::allreduce(sums.data(), int(sums.size()), MPI_DOUBLE, MPI_SUM, WaitOn(comm, "synthetic stats"),
                       "synthetic stats");
  run_agreed(comm, "synthetic", [&] {
    double n = double(o.train_samples) * double(o.height * o.width);
    std::vector<double> mean(o.channels), sd(o.channels);
    for (std::int64_t c = 0; c < o.channels; ++c) {
      double m = sums[2 * c] / n;
      mean[c] = m / 255.0;
      sd[c] = std::sqrt(std::max(0.0, sums[2 * c + 1] / n - m * m)) / 255.0;
      if (sd[c] <= 0) sd[c] = 1.0;
    }
    for (auto& w : mine) {
      w->set_stats(mean, sd);
      w->commit();
    }
  });
  if (comm.valid()) comm.barrier();
  out.train = read_file_info(out.train_files.front());
  return out;
}

}  // namespace ringtrain::data
