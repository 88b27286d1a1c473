// The loader of device modules (see device_module.hpp). One attempt per process:
// every rank that asks gets the same answer, and a failed load is reported the
// same way each time instead of re-reading the disk.
#include "ringtrain/core/device_module.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

constexpr const char* kCudaModule = "libringtrain_cuda.so";

struct State {
  std::once_flag once;
  void* handle = nullptr;
  std::string error;  // set when the load failed
};

State& cuda_state() {
  static State s;
  return s;
}

// The folder of the shared library (or executable) that holds this function.
std::string own_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_dir), &info) || !info.dli_fname) return "";
  std::error_code ec;
  auto p = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::filesystem::path(info.dli_fname).parent_path().string() : p.parent_path().string();
}

void load_cuda(State& s) {
  // Already in the process (a program linked against it): reuse it, never a second copy.
  if ((s.handle = dlopen(kCudaModule, RTLD_NOW | RTLD_NOLOAD))) return;
  std::string tried;
  for (const std::string& path : device_module_paths(DeviceKind::cuda)) {
    if (!std::filesystem::exists(path)) {
      tried += cat("\n  ", path, ": no such file");
      continue;
    }
    if ((s.handle = dlopen(path.c_str(), RTLD_NOW))) return;
    const char* e = dlerror();
    tried += cat("\n  ", path, ": ", e ? e : "unknown dlopen error");
    break;  // the first module found is the one meant: never fall back to another install's
  }
  s.error = cat("cannot load the CUDA backend module ", kCudaModule, "; tried:", tried,
                "\nHINT: install or copy ", kCudaModule, " beside libringtrain_core.so with the CUDA libraries "
                "(cudart, cuBLAS, cuDNN) it needs on the loader's path, or use train.device = cpu");
}

}  // namespace

std::vector<std::string> device_module_paths(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return {};
  std::vector<std::string> paths;
  const std::string here = own_dir();
  if (!here.empty()) paths.push_back((std::filesystem::path(here) / kCudaModule).string());
  const std::string installed = (std::filesystem::path(RT_INSTALL_LIBDIR) / kCudaModule).string();
  if (paths.empty() || paths.front() != installed) paths.push_back(installed);
  return paths;
}

void load_device_module(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return;
  State& s = cuda_state();
  std::call_once(s.once, [&] { load_cuda(s); });
  RT_CHECK(s.error.empty(), s.error);
}

bool device_driver_present(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return true;
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidiactl", ec) || std::filesystem::exists("/proc/driver/nvidia", ec);
}

}  // namespace ringtrain
