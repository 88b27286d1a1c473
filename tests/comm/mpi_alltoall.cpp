// All-to-all(v) against MPI's own MPI_Alltoall / MPI_Alltoallv on the same
// random data, bitwise: equal and uneven blocks (zero-length ones included),
// gaps between receive blocks that must stay untouched, both algorithms; the
// count exchange; and mismatched counts, which raise an Error naming the ranks
// instead of hanging or overrunning a buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "reference.hpp"
#include "ringtrain/comm/alltoall.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

const Algorithm kAlgos[] = {Algorithm::automatic, Algorithm::mpi};
const DType kDtypes[] = {DType::f32, DType::bf16, DType::i64, DType::u8};

std::string label(const char* what, Algorithm a, DType t, std::size_t n) {
  return std::string(what) + " " + algorithm_name(a) + " " + dtype_name(t) + " n=" + std::to_string(n);
}

TEST(Alltoall, MatchesMpiAlltoallBitwise) {
  auto comm = Communicator::world();
  const int p = comm.size();
  // 70000 f32 = 280 KB per block: past Open MPI's eager limit (rendezvous protocol).
  for (Algorithm a : kAlgos)
    for (DType t : kDtypes)
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{5003}, std::size_t{70000}}) {
        const auto what = label("alltoall", a, t, n);
        SCOPED_TRACE(what);
        const std::size_t es = dtype_size(t);
        auto send = make_data(t, n * p, comm.rank(), 11);
        std::vector<unsigned char> got(n * p * es + 1, 0xAB), want(got);
        MPI_Alltoall(send.data(), static_cast<int>(n * es), MPI_BYTE, want.data(), static_cast<int>(n * es), MPI_BYTE,
                     MPI_COMM_WORLD);
        alltoall(send.data(), got.data(), n, t, comm, CollectiveOptions{a});
        EXPECT_TRUE(got == want) << what;
      }
}

// Elements rank i sends rank j: a shared pseudo-random matrix, about a third zeros.
std::size_t matrix(int i, int j, unsigned salt, std::size_t scale) {
  std::uint64_t z =
      (static_cast<std::uint64_t>(i) * 1000003u + static_cast<std::uint64_t>(j) * 7919u + salt) * 0x9e3779b97f4a7c15ull;
  z ^= z >> 29;
  const std::size_t k = z % 9;
  return k < 3 ? 0 : k * scale;
}

TEST(Alltoallv, MatchesMpiAlltoallvWithUnevenAndZeroBlocks) {
  auto comm = Communicator::world();
  const int p = comm.size(), r = comm.rank();
  for (Algorithm a : kAlgos)
    for (DType t : kDtypes)
      for (std::size_t scale : {std::size_t{1}, std::size_t{97}, std::size_t{9000}})
        for (unsigned salt : {1u, 2u}) {
          const auto what = label("alltoallv", a, t, scale) + " salt=" + std::to_string(salt);
          SCOPED_TRACE(what);
          const std::size_t es = dtype_size(t);
          std::vector<std::size_t> sc(p), rc(p), sd(p), rd(p);
          // Send blocks in reverse rank order, receive blocks with a 3-element gap after each.
          std::size_t stotal = 0, rtotal = 0;
          for (int j = p - 1; j >= 0; --j) {
            sc[j] = matrix(r, j, salt, scale);
            sd[j] = stotal;
            stotal += sc[j];
          }
          for (int i = 0; i < p; ++i) {
            rc[i] = matrix(i, r, salt, scale);
            rd[i] = rtotal;
            rtotal += rc[i] + 3;
          }
          auto send = make_data(t, stotal, r, 13 + salt);
          std::vector<unsigned char> got(rtotal * es + 1, 0xCD), want(got);
          auto ints = [&](const std::vector<std::size_t>& v) {
            std::vector<int> o(v.size());
            for (std::size_t k = 0; k < v.size(); ++k) o[k] = static_cast<int>(v[k] * es);
            return o;
          };
          auto isc = ints(sc), isd = ints(sd), irc = ints(rc), ird = ints(rd);
          MPI_Alltoallv(send.data(), isc.data(), isd.data(), MPI_BYTE, want.data(), irc.data(), ird.data(), MPI_BYTE,
                        MPI_COMM_WORLD);
          alltoallv(send.data(), sc, sd, got.data(), rc, rd, t, comm, CollectiveOptions{a});
          EXPECT_TRUE(got == want) << what;  // the gaps (0xCD) included
          // validate = true agrees on the counts first and moves the same data.
          std::vector<unsigned char> again(got.size(), 0xCD);
          CollectiveOptions v{a};
          v.validate = true;
          alltoallv(send.data(), sc, sd, again.data(), rc, rd, t, comm, v);
          EXPECT_TRUE(again == want) << what << " (validate)";
        }
}

// The started form (alltoallv_start ... wait) moves the same bytes as MPI's
// MPI_Alltoallv while the caller computes and pokes progress in between; the
// gaps stay untouched, both algorithms.
TEST(Alltoallv, StartedFormMatchesMpiWhileTheCallerComputes) {
  auto comm = Communicator::world();
  const int p = comm.size(), r = comm.rank();
  for (Algorithm a : kAlgos)
    for (std::size_t scale : {std::size_t{1}, std::size_t{9000}})
      for (unsigned salt : {1u, 2u}) {
        const auto what = label("alltoallv_start", a, DType::f32, scale) + " salt=" + std::to_string(salt);
        SCOPED_TRACE(what);
        std::vector<std::size_t> sc(p), rc(p), sd(p), rd(p);
        std::size_t stotal = 0, rtotal = 0;
        for (int j = 0; j < p; ++j) {
          sc[j] = matrix(r, j, salt, scale), sd[j] = stotal, stotal += sc[j];
          rc[j] = matrix(j, r, salt, scale), rd[j] = rtotal, rtotal += rc[j] + 3;
        }
        auto send = make_data(DType::f32, stotal, r, 17 + salt);
        std::vector<unsigned char> got(rtotal * 4 + 1, 0xCD), want(got);
        std::vector<int> isc(p), isd(p), irc(p), ird(p);
        for (int j = 0; j < p; ++j)
          isc[j] = int(sc[j] * 4), isd[j] = int(sd[j] * 4), irc[j] = int(rc[j] * 4), ird[j] = int(rd[j] * 4);
        MPI_Alltoallv(send.data(), isc.data(), isd.data(), MPI_BYTE, want.data(), irc.data(), ird.data(), MPI_BYTE,
                      MPI_COMM_WORLD);
        AlltoallvRequest req = alltoallv_start(send.data(), sc, sd, got.data(), rc, rd, DType::f32, comm,
                                               CollectiveOptions{a});
        EXPECT_TRUE(req.pending());
        // This rank's own block is there at once (no exchange needed).
        if (a != Algorithm::mpi && rc[r] > 0) {
          EXPECT_EQ(std::memcmp(got.data() + rd[r] * 4, want.data() + rd[r] * 4, rc[r] * 4), 0) << what;
        }
        double sink = 0;
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 100000; ++j) sink += std::sqrt(double(j + i));
          req.progress();
        }
        EXPECT_GT(sink, 0);
        EXPECT_GE(req.wait(), 0.0);
        EXPECT_FALSE(req.pending());
        EXPECT_EQ(req.wait(), 0.0);  // nothing left: a no-op
        EXPECT_TRUE(got == want) << what;
      }
}

// A wrong length in the started form is raised by wait() on the receiver, naming the sender.
TEST(Alltoallv, StartedFormMismatchIsAnErrorNamingTheSender) {
  auto comm = Communicator::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const int p = comm.size(), r = comm.rank();
  std::vector<std::size_t> sc(p, 4), rc(p, 4);
  if (r == 1) sc[0] = 3;
  std::vector<float> send(64, 1.0f), recv(4 * p, 0.0f);
  std::string err;
  try {
    AlltoallvRequest req =
        alltoallv_start(send.data(), sc, packed_displs(sc), recv.data(), rc, packed_displs(rc), DType::f32, comm);
    req.wait();
  } catch (const Error& e) {
    err = e.what();
  }
  if (r == 0) {
    EXPECT_NE(err.find("alltoallv_start: rank 1 of 'world' (world rank 1) sent 3 elements to rank 0, but "
                       "recv_counts[1] = 4 here"),
              std::string::npos)
        << err;
  } else {
    EXPECT_EQ(err, "");
  }
}

TEST(Alltoallv, ExchangeCountsReturnsWhatEachPeerSends) {
  auto comm = Communicator::world();
  const int p = comm.size(), r = comm.rank();
  std::vector<std::size_t> sc(p), want(p);
  for (int j = 0; j < p; ++j) sc[j] = matrix(r, j, 5, 1000003);  // beyond 32 bits when scaled up
  for (int i = 0; i < p; ++i) want[i] = matrix(i, r, 5, 1000003);
  for (std::size_t& c : sc) c *= 5000;
  for (std::size_t& c : want) c *= 5000;
  EXPECT_EQ(exchange_counts(sc, comm), want);
  EXPECT_EQ(packed_displs({3, 0, 2}), (std::vector<std::size_t>{0, 3, 3}));
}

// Counts first, then the payload: the same bytes as MPI_Alltoallv given the counts MPI_Alltoall exchanged.
TEST(Alltoallv, ExchangingCountsMatchesMpi) {
  auto comm = Communicator::world();
  const int p = comm.size(), r = comm.rank();
  for (unsigned salt : {3u, 4u}) {
    std::vector<std::size_t> sc(p);
    for (int j = 0; j < p; ++j) sc[j] = matrix(r, j, salt, 257);
    const auto sd = packed_displs(sc);
    auto send = make_data(DType::bf16, sd.back() + sc.back(), r, salt);
    std::vector<unsigned char> got;
    const auto rc = alltoallv_exchanging_counts(send.data(), sc, got, DType::bf16, comm);
    std::vector<int> isc(p), isd(p), irc(p), ird(p);
    for (int j = 0; j < p; ++j) isc[j] = static_cast<int>(sc[j] * 2);
    MPI_Alltoall(isc.data(), 1, MPI_INT, irc.data(), 1, MPI_INT, MPI_COMM_WORLD);
    int total = 0;
    for (int j = 0; j < p; ++j) {
      isd[j] = static_cast<int>(sd[j] * 2);
      ird[j] = total;
      total += irc[j];
      EXPECT_EQ(rc[j] * 2, static_cast<std::size_t>(irc[j])) << "from rank " << j;
    }
    std::vector<unsigned char> want(static_cast<std::size_t>(total));
    MPI_Alltoallv(send.data(), isc.data(), isd.data(), MPI_BYTE, want.data(), irc.data(), ird.data(), MPI_BYTE,
                  MPI_COMM_WORLD);
    EXPECT_TRUE(got == want) << "salt " << salt;
  }
}

// Rank 1 sends rank 0 `delta` more (or fewer) elements than rank 0 expects.
// Without validate, rank 0 raises an Error naming rank 1 once the exchange has
// completed, and no other rank raises; with validate, every rank raises before
// any data moves.
void mismatch(long delta, bool validate) {
  auto comm = Communicator::world();
  const int p = comm.size(), r = comm.rank();
  std::vector<std::size_t> sc(p, 4), rc(p, 4);
  if (r == 1) sc[0] = static_cast<std::size_t>(4 + delta);
  auto sd = packed_displs(sc), rd = packed_displs(rc);
  std::vector<float> send(64, 1.0f), recv(4 * p + 16, 0.0f);
  CollectiveOptions opt;
  opt.validate = validate;
  std::string err;
  try {
    alltoallv(send.data(), sc, sd, recv.data(), rc, rd, DType::f32, comm, opt);
  } catch (const Error& e) {
    err = e.what();
  }
  if (r == 0) {
    EXPECT_NE(err.find("alltoallv: rank 1 of 'world' (world rank 1) sen"), std::string::npos) << err;
    EXPECT_NE(err.find("recv_counts[1] = 4"), std::string::npos) << err;
    EXPECT_NE(err.find("counts disagree"), std::string::npos) << err;
  } else if (validate) {
    EXPECT_NE(err.find("alltoallv: rank 0 of 'world' (world rank 0) found its arguments invalid"), std::string::npos)
        << err;
  } else {
    EXPECT_EQ(err, "");
  }
  EXPECT_EQ(recv[4 * p], 0.0f) << "a longer block overran the receive buffer";
}

TEST(Alltoallv, LongerBlockThanExpectedIsAnErrorNamingTheSender) {
  if (Communicator::world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  mismatch(+1, false);
}
TEST(Alltoallv, ShorterBlockThanExpectedIsAnErrorNamingTheSender) {
  if (Communicator::world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  mismatch(-1, false);
}
TEST(Alltoallv, MismatchWithValidateFailsEveryRank) {
  if (Communicator::world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  mismatch(+2, true);
  mismatch(-4, true);
}

TEST(Alltoallv, LocalArgumentErrorsNameTheArgument) {
  auto comm = Communicator::world();
  const int p = comm.size(), r = comm.rank();
  std::vector<float> buf(4 * p + 4);
  std::vector<std::size_t> c(p, 1), d = packed_displs(c), shorter(p + 1, 1);
  auto msg = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([&] {
              alltoallv(buf.data(), shorter, d, buf.data() + 2 * p, c, d, DType::f32, comm);
            }).find("send_counts and send_displs need " + std::to_string(p) + " entries"),
            std::string::npos);
  EXPECT_NE(msg([&] { alltoallv(buf.data(), c, d, buf.data(), c, d, DType::f32, comm); }).find("overlap"),
            std::string::npos);
  EXPECT_NE(
      msg([&] { alltoallv(nullptr, c, d, buf.data() + 2 * p, c, d, DType::f32, comm); }).find("send buffer is null"),
      std::string::npos);
  // One rank's local error reaches every rank under validate.
  CollectiveOptions v;
  v.validate = true;
  const std::string e =
      msg([&] { alltoallv(r == 0 ? nullptr : buf.data(), c, d, buf.data() + 2 * p, c, d, DType::f32, comm, v); });
  EXPECT_NE(e.find(r == 0 ? "send buffer is null" : "rank 0 of 'world' (world rank 0) found its arguments invalid"),
            std::string::npos)
      << e;
}

}  // namespace
