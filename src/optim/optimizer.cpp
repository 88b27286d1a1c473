// Optimizer base: state buffers beside the arena, the step counter, state
// save/load, and the factory with hyper-parameter validation.
#include "ringtrain/optim/optimizer.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "cpu_loops.hpp"

namespace ringtrain {

std::string canonical_optimizer_name(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* known : {"sgd", "adam", "adamw", "lars", "lamb"})
    if (s == known) return s;
  RT_FAIL("unknown optimizer '", name, "' (expected sgd, adam, adamw, lars or lamb)");
}

namespace {
void check_range(bool ok, const std::string& opt, const char* field, double v, const char* want) {
  RT_CHECK(ok, "optimizer '", opt, "': ", field, " = ", v, " is invalid (", want, ")");
}

void validate(const OptimizerConfig& cfg) {
  const std::string& n = cfg.name;
  auto fin = [](double x) { return std::isfinite(x); };
  check_range(fin(cfg.weight_decay) && cfg.weight_decay >= 0, n, "weight_decay", cfg.weight_decay, "finite, >= 0");
  check_range(fin(cfg.momentum) && cfg.momentum >= 0, n, "momentum", cfg.momentum, "finite, >= 0");
  check_range(fin(cfg.dampening) && cfg.dampening >= 0 && cfg.dampening <= 1, n, "dampening", cfg.dampening, "in [0, 1]");
  check_range(cfg.beta1 >= 0 && cfg.beta1 < 1, n, "beta1", cfg.beta1, "in [0, 1)");
  check_range(cfg.beta2 >= 0 && cfg.beta2 < 1, n, "beta2", cfg.beta2, "in [0, 1)");
  check_range(fin(cfg.eps) && cfg.eps >= 0, n, "eps", cfg.eps, "finite, >= 0");
  check_range(fin(cfg.trust_coefficient) && cfg.trust_coefficient > 0, n, "trust_coefficient",
              cfg.trust_coefficient, "finite, > 0");
  check_range(fin(cfg.max_trust_ratio), n, "max_trust_ratio", cfg.max_trust_ratio, "finite; <= 0 disables the clip");
  RT_CHECK(!cfg.nesterov || n == "sgd", "optimizer '", n, "': nesterov applies to sgd only");
  RT_CHECK(!cfg.nesterov || (cfg.momentum > 0 && cfg.dampening == 0), "optimizer 'sgd': nesterov needs momentum > 0 "
           "and dampening 0 (got momentum ", cfg.momentum, ", dampening ", cfg.dampening, ")");
}

OptimizerConfig named(OptimizerConfig cfg, const char* name) {
  cfg.name = name;
  return cfg;
}
}  // namespace

Optimizer::Optimizer(ParamArena& arena, OptimizerConfig cfg, const char* name)
    : arena_(arena), cfg_(named(std::move(cfg), name)) {
  validate(cfg_);
  RT_CHECK(arena_.finalized(), "optimizer '", cfg_.name, "': the parameter arena is not finalised");
  for (DType dt : arena_.dtypes())
    optim_detail::dispatch_floating(dt, "optimizer", [](auto) {});
  step_ = Tensor::zeros({1}, DType::i64);
}

void Optimizer::require_cpu() const {
  RT_CHECK(arena_.device().is_cpu(), "optimizer '", cfg_.name, "': this implementation updates a CPU arena, got ",
           arena_.device().str());
}

std::int64_t Optimizer::steps() const { return step_.data<std::int64_t>()[0]; }

bool Optimizer::decays(std::size_t param) const { return cfg_.decay_all || arena_.info(param).decay; }

void Optimizer::step(double lr) {
  RT_CHECK(std::isfinite(lr) && lr >= 0.0, "optimizer '", cfg_.name, "': learning rate must be finite and >= 0, got ", lr);
  const std::int64_t t = steps() + 1;
  update(lr, t);
  arena_.mark_updated();  // derived bf16 weight copies are recast before the next forward
  step_.data<std::int64_t>()[0] = t;
}

void Optimizer::add_state(const std::string& kind) {
  for (DType dt : arena_.dtypes()) {
    const std::int64_t n = arena_.params_flat(dt).numel();
    buffers_.emplace_back(cat(dtype_name(dt), ".", kind),
                          Tensor::zeros({n}, optim_detail::state_dtype(dt), arena_.device()));
  }
}

Tensor Optimizer::state_flat(const std::string& kind, DType param_dtype) const {
  const std::string name = cat(dtype_name(param_dtype), ".", kind);
  for (const auto& [n, t] : buffers_)
    if (n == name) return t;
  RT_FAIL("optimizer '", cfg_.name, "' has no state buffer '", name, "'");
}

Optimizer::NamedTensors Optimizer::state() const {
  NamedTensors out = buffers_;
  out.emplace_back("step", step_);
  return out;
}

void Optimizer::load_state(const NamedTensors& in) {
  const NamedTensors mine = state();
  RT_CHECK(in.size() == mine.size(), "optimizer '", cfg_.name, "': load_state got ", in.size(),
           " tensors, expected ", mine.size());
  // Check everything first so a bad input leaves the state untouched.
  std::vector<const Tensor*> src(mine.size());
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const auto& [name, dst] = mine[k];
    auto it = std::find_if(in.begin(), in.end(), [&](const auto& p) { return p.first == name; });
    RT_CHECK(it != in.end(), "optimizer '", cfg_.name, "': load_state is missing '", name, "'");
    RT_CHECK(it->second.defined() && it->second.dtype() == dst.dtype() && it->second.numel() == dst.numel(),
             "optimizer '", cfg_.name, "': state '", name, "' must be ", dtype_name(dst.dtype()), " with ",
             dst.numel(), " elements, got ",
             it->second.defined() ? cat(dtype_name(it->second.dtype()), " with ", it->second.numel(), " elements")
                                  : std::string("an undefined tensor"));
    src[k] = &it->second;
  }
  const Tensor step_in = src.back()->to(Device::cpu());
  RT_CHECK(step_in.data<std::int64_t>()[0] >= 0, "optimizer '", cfg_.name, "': load_state got a negative step count ",
           step_in.data<std::int64_t>()[0]);
  for (std::size_t k = 0; k < mine.size(); ++k) {
    Tensor dst = mine[k].second;
    dst.copy_from(*src[k]);
  }
}

std::unique_ptr<Optimizer> make_optimizer(ParamArena& arena, const OptimizerConfig& cfg) {
  const std::string n = canonical_optimizer_name(cfg.name);
  if (n == "sgd") return std::make_unique<Sgd>(arena, cfg);
  if (n == "adam") return std::make_unique<Adam>(arena, cfg, /*decoupled=*/false);
  if (n == "adamw") return std::make_unique<Adam>(arena, cfg, /*decoupled=*/true);
  if (n == "lars") return std::make_unique<Lars>(arena, cfg);
  return std::make_unique<Lamb>(arena, cfg);
}

}  // namespace ringtrain
