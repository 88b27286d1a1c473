#pragma once
// Rank-prefixed logging to stderr. The prefix ("[rank 3] ") is set once after
// MPI start-up; by default only rank 0 prints info lines ("rank 0 speaks for the
// job"), every rank prints warnings and errors.
#include <string>

#include "ringtrain/core/error.hpp"

namespace ringtrain::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

void set_rank(int rank, int size);
void set_level(Level l);
// Replaces "[rank N] " (e.g. with the process-grid coordinates "[rank 5 dp 1 pp 2] "); "" restores it.
void set_prefix(const std::string& prefix);
void set_all_ranks(bool all);  // info from every rank, not only rank 0
void write(Level l, const std::string& msg);

template <typename... A> void debug(A&&... a) { write(Level::debug, cat(std::forward<A>(a)...)); }
template <typename... A> void info(A&&... a) { write(Level::info, cat(std::forward<A>(a)...)); }
template <typename... A> void warn(A&&... a) { write(Level::warn, cat(std::forward<A>(a)...)); }
template <typename... A> void error(A&&... a) { write(Level::error, cat(std::forward<A>(a)...)); }

}  // namespace ringtrain::log
