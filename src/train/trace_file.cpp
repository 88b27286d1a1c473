#include "ringtrain/train/trace_file.hpp"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/trace.hpp"

namespace ringtrain {

std::size_t write_trace(const std::string& path, const Communicator& world, const std::string& title) {
  std::size_t spans = 0;
  const std::string mine = trace::stop(world.rank(), &spans);
  // Sizes first, then the bytes (our allgatherv: bounded, flight-recorded). A
  // few steps of spans: a few MB at most on every rank.
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(world.size()));
  std::int64_t n = static_cast<std::int64_t>(mine.size());
  allgather(&n, 1, sizes.data(), DType::i64, world);
  std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  std::string all(total, '\0');
  allgatherv(mine.data(), all.data(), counts, DType::u8, world);
  std::uint64_t written = spans;
  allreduce(&written, &written, 1, DType::i64, ReduceOp::sum, world);
  std::string error;
  if (world.rank() == 0) {
    try {
      const std::filesystem::path p(path);
      if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
      std::FILE* f = std::fopen(path.c_str(), "w");
      RT_CHECK(f != nullptr, "cannot open '", path, "' for writing");
      std::string head = "{\"displayTimeUnit\": \"ms\",\n\"otherData\": " +
                         nlohmann::json{{"title", title}, {"ranks", world.size()}}.dump() + ",\n\"traceEvents\": [\n";
      for (int r = 0; r < world.size(); ++r)
        head += nlohmann::json{{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", cat("rank ", r)}}}}
                    .dump() +
                ",\n";
      std::fputs(head.c_str(), f);
      std::size_t at = 0;
      bool first = true;
      for (std::size_t c : counts) {
        if (c > 0) {
          if (!first) std::fputs(",\n", f);
          std::fwrite(all.data() + at, 1, c, f);
          first = false;
        }
        at += c;
      }
      if (first) std::fputs("{}", f);  // the list stays valid JSON without a span
      std::fputs("\n]}\n", f);
      RT_CHECK(std::fclose(f) == 0, "cannot finish writing '", path, "'");
    } catch (const Error& e) {
      error = e.what();
    }
  }
  int bad = error.empty() ? 0 : 1;
  broadcast(&bad, 1, DType::i32, 0, world);
  RT_CHECK(bad == 0, "log.trace: ", world.rank() == 0 ? error : "rank 0 could not write the trace file '" + path + "'");
  return static_cast<std::size_t>(written);
}

}  // namespace ringtrain
