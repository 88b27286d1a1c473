#pragma once
// Errors: every failure is a ringtrain::Error whose message names the thing
// and what is wrong. RT_CHECK is for conditions a user can cause (bad input,
// mismatched ranks); RT_ASSERT for internal invariants.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ringtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An Error that every rank of a communicator raised together (comm/agree.hpp):
// the job can end cleanly, with one message, instead of aborting.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// cat("a", 1, 'b') -> "a1b": message building without <format> (g++ 12).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

namespace detail {
[[noreturn]] void raise_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace ringtrain

#define RT_CHECK(cond, ...)                                                         \
  do {                                                                              \
    if (!(cond)) ::ringtrain::detail::raise_error(__FILE__, __LINE__,               \
                                                  ::ringtrain::cat(__VA_ARGS__));   \
  } while (0)

#define RT_FAIL(...) ::ringtrain::detail::raise_error(__FILE__, __LINE__, ::ringtrain::cat(__VA_ARGS__))

#define RT_ASSERT(cond) RT_CHECK(cond, "internal error: ", #cond)
