// The ringtrain binary: the command line lives in the library (ringtrain/cli/main.hpp),
// so that programs with models of their own get the same one.
#include "ringtrain/cli/main.hpp"

int main(int argc, char** argv) { return ringtrain::main(argc, argv); }
