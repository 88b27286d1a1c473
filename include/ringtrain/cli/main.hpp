#pragma once
// The whole `ringtrain` command line (train, eval, prepare, with TOML, --set,
// checkpoints, --resume auto, metrics and every data x pipeline x tensor
// layout) as a library function. The ringtrain binary's main() only calls it;
// a program of its own registers its models first (nn/model_registry.hpp):
//   int main(int argc, char** argv) {
//     ringtrain::register_model("mynet", build_mynet);
//     return ringtrain::main(argc, argv);
//   }
// It starts MPI unless the program already did (and then finalises it on
// return only if it started it), so call it once per process. Returns the
// exit status of train/exit_codes.hpp: 0, bad input (2), failure, stopped by
// a signal after a checkpoint (75). The --help text names the program after argv[0].
namespace ringtrain {

int main(int argc, char** argv);

}  // namespace ringtrain
