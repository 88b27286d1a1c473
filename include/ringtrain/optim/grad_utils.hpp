#pragma once
// Gradient utilities on a CPU ParamArena: mixed-precision unscaling with an
// inf/NaN check, global-norm computation and clipping (torch.nn.utils
// .clip_grad_norm_ semantics). Element math is optim_math::* (shared with CUDA).
//
// Rules kept here: all gradients of every dtype take part; norms are summed in
// double over fixed chunks, so the result has the same bits for any thread count.
#include <vector>

#include "ringtrain/nn/parameters.hpp"

namespace ringtrain {

// grads *= inv_scale; returns true when every gradient is finite afterwards
// (false: the caller skips the optimizer step and lowers the loss scale).
bool unscale_grads(ParamArena& arena, double inv_scale);

// True when every gradient element is finite.
bool grads_finite(const ParamArena& arena);

// Sum of g² over the gradients of the parameters `include` selects (indexed
// like the arena; empty = every parameter, padding included, which is zero).
double grad_sq_norm(const ParamArena& arena, const std::vector<char>& include = {});

// sqrt(sum over all gradients of g²).
double grad_global_norm(const ParamArena& arena);

// The one clipping rule (torch.nn.utils.clip_grad_norm_): gradients are scaled
// by this when it is below 1. Every clipping path (one arena, the grid's
// whole-model norm, ZeRO slices) takes its coefficient from here.
inline double clip_coefficient(double total_norm, double max_norm) { return max_norm / (total_norm + 1e-6); }

// Scales all gradients by max_norm / (norm + 1e-6) when that is below 1; returns
// the norm before clipping (as torch.nn.utils.clip_grad_norm_). max_norm > 0.
double clip_grad_norm(ParamArena& arena, double max_norm);

}  // namespace ringtrain
