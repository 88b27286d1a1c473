#include "ringtrain/core/device.hpp"

#include <charconv>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

std::string Device::str() const {
  return kind == DeviceKind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.substr(0, 5) == "cuda:") {
    int i = -1;
    auto rest = s.substr(5);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), i);
    if (ec == std::errc() && p == rest.data() + rest.size() && i >= 0) return Device::cuda(i);
  }
  RT_FAIL("unknown device '", s, "' (expected cpu, cuda or cuda:N)");
}

}  // namespace ringtrain
