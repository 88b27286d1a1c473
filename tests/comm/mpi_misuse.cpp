// Misuse of the collectives gives an Error naming the operation on every rank
// that can know about it; never a hang or a silent wrong answer.
#include <gtest/gtest.h>

#include <string>

#include "reference.hpp"
#include "ringtrain/comm/host_backend.hpp"

using namespace ringtrain;

namespace {

// Runs f, expects an Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown (expected one mentioning '" << *parts.begin() << "')";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "message: " << m << "\nmissing: " << p;
  }
}

// Tags above the standard's guaranteed 32767 work on some MPI libraries only:
// the transport refuses them everywhere, naming the tag and the operation.
TEST(Misuse, TransportRefusesTagsBeyondTheGuaranteedRange) {
  auto comm = Communicator::world();
  MPI_Comm h = comm.handle();
  expect_error([&] { MpiTransport t(h, kMaxMpiTag + 1, "send test", "world", 1, 0); }, {"send test", "32768", "32767"});
  expect_error([&] { MpiTransport t(h, -1, "send test", "world", 1, 0); }, {"send test", "-1"});
  MpiTransport ok(h, kMaxMpiTag, "send test", "world", 1, 0);
  EXPECT_EQ(ok.size(), comm.size());
}

TEST(Misuse, NullBufferWithCount) {
  auto comm = Communicator::world();
  float x[4] = {1, 2, 3, 4};
  for (bool validate : {false, true}) {
    CollectiveOptions opt;
    opt.validate = validate;
    expect_error([&] { allreduce(nullptr, x, 4, DType::f32, ReduceOp::sum, comm, opt); },
                 {"allreduce", "send buffer is null"});
    expect_error([&] { allreduce(x, nullptr, 4, DType::f32, ReduceOp::sum, comm, opt); },
                 {"allreduce", "recv buffer is null"});
    expect_error([&] { broadcast(nullptr, 4, DType::f32, 0, comm, opt); }, {"broadcast", "null"});
  }
  // Count 0 with null buffers is a valid no-op.
  allreduce(nullptr, nullptr, 0, DType::f32, ReduceOp::sum, comm);
}

TEST(Misuse, NullBufferOnOneRankFailsEveryRankWhenValidating) {
  auto comm = Communicator::world();
  float x[4] = {1, 2, 3, 4}, y[4];
  CollectiveOptions opt;
  opt.validate = true;
  const float* send = comm.rank() == comm.size() - 1 ? nullptr : x;
  expect_error([&] { allreduce(send, y, 4, DType::f32, ReduceOp::sum, comm, opt); }, {"allreduce"});
  // The communicator is still usable afterwards.
  allreduce(x, y, 4, DType::f32, ReduceOp::sum, comm, opt);
  EXPECT_EQ(y[3], 4.0f * comm.size());
}

TEST(Misuse, ClosedCommunicator) {
  auto comm = Communicator::world().dup("scratch");
  comm.close();
  float x[2] = {1, 2};
  expect_error([&] { allreduce(x, x, 2, DType::f32, ReduceOp::sum, comm); }, {"allreduce", "closed", "scratch"});
  expect_error([&] { broadcast(x, 2, DType::f32, 0, comm); }, {"broadcast", "closed"});
  expect_error([&] { allgather(x, 1, x, DType::f32, comm); }, {"allgather", "closed"});
  expect_error([&] { reduce_scatter(x, x, {1}, DType::f32, ReduceOp::sum, comm); }, {"reduce_scatter", "closed"});
}

TEST(Misuse, MismatchedCountDtypeOpWithValidate) {
  auto comm = Communicator::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  std::vector<double> x(16, 1.0), y(16);
  CollectiveOptions opt;
  opt.validate = true;
  std::size_t n = 10 + comm.rank();
  expect_error([&] { allreduce(x.data(), y.data(), n, DType::f32, ReduceOp::sum, comm, opt); },
               {"allreduce", "count differs", "min 10", "max"});
  DType t = comm.rank() == 0 ? DType::f64 : DType::f32;
  expect_error([&] { allreduce(x.data(), y.data(), 4, t, ReduceOp::sum, comm, opt); },
               {"allreduce", "dtype differs", "float32", "float64"});
  ReduceOp op = comm.rank() == 0 ? ReduceOp::max : ReduceOp::sum;
  expect_error([&] { allreduce(x.data(), y.data(), 4, DType::f64, op, comm, opt); }, {"allreduce", "op differs"});
  int root = comm.rank() == 0 ? 1 : 0;
  expect_error([&] { broadcast(x.data(), 4, DType::f64, root, comm, opt); }, {"broadcast", "root differs"});
  // After all that, a correct call still works.
  allreduce(x.data(), y.data(), 16, DType::f64, ReduceOp::sum, comm, opt);
  EXPECT_EQ(y[0], comm.size());
}

TEST(Misuse, BadArgumentsNameTheOperation) {
  auto comm = Communicator::world();
  int p = comm.size();
  std::vector<float> x(64, 1.0f);
  expect_error([&] { allreduce(x.data(), x.data() + 1, 8, DType::f32, ReduceOp::sum, comm); },
               {"allreduce", "overlap"});
  expect_error([&] { broadcast(x.data(), 4, DType::f32, p, comm); }, {"broadcast", "root"});
  expect_error([&] { allgatherv(x.data(), x.data() + 8, std::vector<std::size_t>(p + 1, 1), DType::f32, comm); },
               {"allgatherv", "counts has"});
  expect_error([&] { reduce_scatter(x.data(), x.data(), std::vector<std::size_t>(p + 2, 1), DType::f32,
                                    ReduceOp::sum, comm); },
               {"reduce_scatter", "counts has"});
  expect_error([&] { allreduce(x.data(), x.data(), 4, static_cast<DType>(42), ReduceOp::sum, comm); },
               {"allreduce", "dtype"});
  CollectiveOptions cuda;
  cuda.device = Device::cuda(0);
  expect_error([&] { allreduce(x.data(), x.data(), 4, DType::f32, ReduceOp::sum, comm, cuda); },
               {"allreduce", "cuda:0"});
  expect_error([] { parse_algorithm("butterfly"); }, {"butterfly", "ring"});
  expect_error([] { parse_op("prod"); }, {"prod"});
  expect_error([] { parse_byte_size("lots", "-b"); }, {"-b", "lots"});
  EXPECT_EQ(parse_byte_size("256M"), 256u << 20);
  EXPECT_EQ(parse_algorithm("automatic"), Algorithm::automatic);
  EXPECT_EQ(parse_op("avg"), ReduceOp::avg);
}

}  // namespace
