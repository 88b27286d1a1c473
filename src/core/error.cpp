#include "ringtrain/core/error.hpp"

namespace ringtrain::detail {

[[noreturn]] void raise_error(const char* /*file*/, int /*line*/, const std::string& msg) {
  // The message is for users: it names the thing and what is wrong. Source
  // locations stay out of it; RINGTRAIN_LOG=debug builds can add them later.
  throw Error(msg);
}

}  // namespace ringtrain::detail
