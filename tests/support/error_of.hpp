#pragma once
// error_of(f): the message of the ringtrain::Error that f() throws, or
// "<no error>" — so a test can assert on what an error names.
#include <string>

#include "ringtrain/core/error.hpp"

namespace ringtrain::test_support {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace ringtrain::test_support
