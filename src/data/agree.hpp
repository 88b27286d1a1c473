#pragma once
// Collective error agreement: a rank never fails alone. Each rank runs its part
// and records the Error it hit (if any); the ranks then agree (MPI_Allreduce)
// and every rank throws the message of the lowest failing rank, prefixed with
// that rank, so the trainer sees the same error everywhere instead of a hang.
#include <string>

#include "ringtrain/comm/communicator.hpp"

namespace ringtrain::data {

// Throws on every rank when `local_error` is non-empty on any rank.
void agree_or_throw(const Communicator& comm, const std::string& local_error, const char* what);

// Runs f() on every rank and agrees on failure (Error or std::exception).
template <typename F>
void run_agreed(const Communicator& comm, const char* what, F&& f) {
  std::string err;
  try {
    f();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  agree_or_throw(comm, err, what);
}

}  // namespace ringtrain::data
