// train.threads against the node's CPUs and the rank's affinity mask: the
// warning the trainer logs at start (run_options.hpp thread_oversubscription).
#include <gtest/gtest.h>

#include <string>

#include "../../src/train/run_options.hpp"

namespace ringtrain {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ThreadOversubscription, OneThreadNeverWarns) {
  EXPECT_EQ(thread_oversubscription(1, 8, 2, 2), "");  // 8 ranks on 2 cores: mpirun's --oversubscribe, asked for
  EXPECT_EQ(thread_oversubscription(1, 1, 1, 1), "");
}

TEST(ThreadOversubscription, MoreThreadsThanTheNodeHasNamesTheKeyAndTheCounts) {
  // This project's machine: 2 ranks on 2 cores, unbound, train.threads = 2.
  const std::string w = thread_oversubscription(2, 2, 2, 2);
  EXPECT_TRUE(has(w, "train.threads = 2 x 2 ranks on this node = 4 compute threads on 2 CPUs")) << w;
  EXPECT_TRUE(has(w, "lower train.threads to 1")) << w;
  const std::string big = thread_oversubscription(8, 16, 64, 64);  // 128 threads on 64 CPUs
  EXPECT_TRUE(has(big, "= 128 compute threads on 64 CPUs")) << big;
  EXPECT_TRUE(has(big, "lower train.threads to 4")) << big;
  EXPECT_EQ(thread_oversubscription(2, 1, 2, 2), "");    // one rank, two cores: fits
  EXPECT_EQ(thread_oversubscription(8, 8, 8, 64), "");   // 8 ranks bound to 8 cores each: fits
  EXPECT_EQ(thread_oversubscription(4, 16, 64, 64), ""); // exactly full
}

TEST(ThreadOversubscription, MoreThreadsThanTheRankIsBoundToNamesTheBinding) {
  const std::string w = thread_oversubscription(4, 2, 2, 64);  // mpirun --bind-to core --map-by ...:PE=2
  EXPECT_TRUE(has(w, "train.threads = 4 on a rank bound to 2 CPU(s)")) << w;
  EXPECT_TRUE(has(w, "--map-by slot:PE=4")) << w;
  EXPECT_TRUE(has(w, "lower train.threads to 2")) << w;
  EXPECT_EQ(thread_oversubscription(4, 2, 0, 64), "");  // the mask unknown (0): only the node's count is checked
}

}  // namespace
}  // namespace ringtrain
