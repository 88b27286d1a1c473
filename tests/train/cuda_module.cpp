// The CUDA backend is a module loaded on demand (core/device_module.hpp): a
// CPU run maps none of the GPU libraries, and the loader looks beside the
// ringtrain library that holds it. (The errors of a missing or broken module,
// on every rank, are tested by cuda_module_errors.sh on the real binary.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fixtures.hpp"
#include "ringtrain/core/device_module.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

namespace {

// Mapped files of this process whose name contains one of the GPU libraries.
std::string gpu_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  for (const char* lib : {"libcudart", "libcublas", "libcudnn", "libcuda.so", "libnccl", "libringtrain_cuda"}) {
    maps.clear();
    maps.seekg(0);
    while (std::getline(maps, line))
      if (line.find(lib) != std::string::npos) found += line + "\n";
  }
  return found;
}

// The folder of the mapped libringtrain_core.so.
std::string core_dir() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto at = line.find('/');
    if (at != std::string::npos && line.find("libringtrain_core.so") != std::string::npos)
      return std::filesystem::canonical(line.substr(at)).parent_path().string();
  }
  return "";
}

}  // namespace

TEST(CudaModule, ACpuRunMapsNoGpuLibrary) {
  EXPECT_EQ(gpu_mappings(), "") << "mapped at start-up";
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "cudamod", 128, 32);
  // auto loads the module only where an NVIDIA driver is present: here, test cpu only.
  for (const char* device : {"cpu", "auto"}) {
    if (std::string(device) == "auto" && device_driver_present(DeviceKind::cuda)) continue;
    TrainConfig c = test_fixtures::small_config(data);
    c.train.device = device;
    c.train.max_steps = 2;
    TrainerHooks hooks;
    hooks.evaluate = false;
    hooks.report = false;
    Trainer t(c, world, hooks);
    t.fit();
    EXPECT_EQ(gpu_mappings(), "") << "train.device = " << device << " mapped GPU libraries";
  }
  std::filesystem::remove_all(data);
}

TEST(CudaModule, IsLookedForBesideTheLibraryFirst) {
  auto paths = device_module_paths(DeviceKind::cuda);
  ASSERT_FALSE(paths.empty());
  ASSERT_NE(core_dir(), "");
  EXPECT_EQ(paths.front(), core_dir() + "/libringtrain_cuda.so");
  EXPECT_TRUE(device_module_paths(DeviceKind::cpu).empty());
}
