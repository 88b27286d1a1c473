#pragma once
// Where memory lives and compute runs. Backends register an Allocator per
// DeviceKind (core/allocator.hpp); everything else asks the registry.
#include <string>
#include <string_view>

namespace ringtrain {

enum class DeviceKind { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int i) { return {DeviceKind::cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

Device parse_device(std::string_view s);  // "cpu", "cuda", "cuda:1"; throws Error

}  // namespace ringtrain
