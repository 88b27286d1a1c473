// Training from a program of its own, the way Horovod is used from a script:
// MPI started by ringtrain, a TrainConfig built in code (any key of the TOML
// files), a Trainer over every rank, fit(), and the result.
//   mpirun -np 2 train_api DATA_DIR [STEPS]
// DATA_DIR gets a small synthetic 28x28 set (prepared collectively) unless it
// already holds one. Prints one line per step on rank 0: "step N loss L".
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/train/trainer.hpp"

int main(int argc, char** argv) {
  ringtrain::MpiRuntime mpi(&argc, &argv);
  ringtrain::Communicator world = ringtrain::Communicator::world();
  if (argc < 2) {
    if (world.rank() == 0) std::fprintf(stderr, "usage: train_api DATA_DIR [STEPS]\n");
    return 2;
  }
  const std::string data = argv[1];
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;

  ringtrain::data::SyntheticOptions so;
  so.output = data;
  so.train_samples = 1024;
  so.test_samples = 128;
  so.channels = 1;
  so.height = so.width = 28;
  ringtrain::data::generate_synthetic(so, world);

  ringtrain::TrainConfig cfg;
  cfg.model.name = "cnn";
  cfg.data.train = cfg.data.test = data;
  cfg.data.batch_size = 32 / world.size();  // the global batch stays 32 at any rank count
  cfg.train.threads = 1;
  cfg.train.max_steps = steps;
  cfg.optimizer.lr = 0.01;
  cfg.log.format = "plain";
  cfg.validate();

  ringtrain::TrainerHooks hooks;
  hooks.report = false;
  hooks.evaluate = false;
  hooks.on_step = [&](std::int64_t step, double loss) {
    if (world.rank() == 0) std::printf("step %lld loss %.6f\n", static_cast<long long>(step), loss);
  };
  ringtrain::Trainer trainer(cfg, world, hooks);
  ringtrain::TrainResult r = trainer.fit();
  if (world.rank() == 0) std::printf("done: %lld steps on %d rank(s)\n", static_cast<long long>(r.steps), world.size());
  return 0;
}
