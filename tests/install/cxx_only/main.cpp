// The whole command line of an installed ringtrain from a C++-only project, plus
// one call of the C++ API before it: the plan of a configuration built in code.
#include <cstdio>
#include <cstring>

#include "ringtrain/cli/main.hpp"
#include "ringtrain/train/plan.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "plan") == 0) {  // no MPI needed: plan_run is arithmetic
    ringtrain::TrainConfig cfg;
    cfg.set("data.global_batch=96");
    cfg.set("parallel.pipeline=2");
    std::printf("%s\n", ringtrain::plan_run(cfg, 6).json().c_str());
    return 0;
  }
  return ringtrain::main(argc, argv);
}
