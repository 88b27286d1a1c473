#pragma once
// Exit status of `ringtrain` (docs/contract: README "Failure behaviour"). The
// same code on every rank: an error every rank agrees on returns it on every
// rank, and an error on one rank ends the job with MPI_Abort(code).
namespace ringtrain::exit_code {

inline constexpr int ok = 0;         // training / evaluation finished
inline constexpr int failure = 1;    // runtime failure: training error, a dead, hung or stalled rank
inline constexpr int bad_input = 2;  // CLI flags, config keys/values, data files, incompatible checkpoint
inline constexpr int stopped = 75;   // EX_TEMPFAIL: stopped by a signal after a checkpoint; resume to continue
// A second signal ends the process at once with 128 + the signal's number.

}  // namespace ringtrain::exit_code
