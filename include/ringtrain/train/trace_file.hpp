#pragma once
// Writes the step window's trace (core/trace.hpp) of every rank into one
// Chrome-trace file: chrome://tracing and https://ui.perfetto.dev open it.
#include <cstddef>
#include <string>

namespace ringtrain {

class Communicator;

// Stops recording on every rank of `world` and gathers the spans to its rank 0,
// which writes `path` (its directory created). Collective, bounded by `world`'s
// timeout; a file that cannot be written is an error on every rank. Returns the
// number of spans in the file.
std::size_t write_trace(const std::string& path, const Communicator& world, const std::string& title);

}  // namespace ringtrain
