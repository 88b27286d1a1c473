#include "ringtrain/nn/model.hpp"

#include <sstream>

namespace ringtrain {

Model::Model(std::string name, Device dev) : name_(std::move(name)), device_(dev) {}
Model::~Model() = default;

void Model::add(LayerPtr layer) {
  RT_CHECK(!finalized_, "model '", name_, "': layer '", layer ? layer->name() : "?", "' added after finalize()");
  RT_CHECK(layer != nullptr, "model '", name_, "': null layer");
  layers_.push_back(std::move(layer));
}

void Model::finalize(const Shape& sample_shape, std::uint64_t seed, MathMode math) {
  RT_CHECK(!finalized_, "model '", name_, "': finalize() called twice");
  RT_CHECK(!layers_.empty(), "model '", name_, "' has no layers");
  sample_shape_ = sample_shape;
  Shape s = {1};
  s.insert(s.end(), sample_shape.begin(), sample_shape.end());
  for (auto& l : layers_) s = l->output_shape(s);  // validates the chain before allocating
  for (std::size_t i = 0; i < layers_.size(); ++i) layers_[i]->register_params(arena_, static_cast<int>(i), "");
  arena_.finalize(device_);
  backend_ = &backend_for(device_);
  BindContext ctx{*backend_, device_, arena_, seed, math};
  for (auto& l : layers_) l->bind(ctx);
  first_param_layer_ = 0;
  while (first_param_layer_ + 1 < layers_.size() && layers_[first_param_layer_]->params().empty()) ++first_param_layer_;
  finalized_ = true;
  reset_parameters(seed);
}

void Model::reset_parameters(std::uint64_t seed) {
  RT_CHECK(finalized_, "model '", name_, "': reset_parameters() before finalize()");
  for (auto& l : layers_) l->init(arena_, seed);
  zero_grad();
}

Tensor Model::forward(const Tensor& x, Mode mode) {
  RT_CHECK(finalized_, "model '", name_, "': forward() before finalize()");
  RT_CHECK(x.defined() && x.ndim() == static_cast<int>(sample_shape_.size()) + 1 && x.dim(0) > 0 &&
               Shape(x.shape().begin() + 1, x.shape().end()) == sample_shape_,
           "model '", name_, "': input must be [N, ", shape_str(sample_shape_).substr(1), ", got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  RT_CHECK(x.device() == device_, "model '", name_, "' lives on ", device_.str(), " but the input is on ",
           x.device().str());
  RT_CHECK(x.dtype() == DType::f32, "model '", name_, "': input must be float32, got ", dtype_name(x.dtype()));
  Tensor h = x;
  for (auto& l : layers_) h = l->forward(h, mode);
  return h;
}

void Model::backward(const Tensor& dlogits, const GradReadyFn& on_ready) {
  RT_CHECK(finalized_, "model '", name_, "': backward() before finalize()");
  RT_CHECK(dlogits.defined() && dlogits.device() == device_, "model '", name_, "': dlogits must be on ",
           device_.str());
  const bool accumulate = !grads_zero_;
  Tensor g = dlogits;
  for (std::size_t i = layers_.size(); i-- > first_param_layer_;) {
    // Nothing before the first layer with parameters needs a gradient.
    g = layers_[i]->backward(g, i > first_param_layer_, accumulate);
    const auto& ps = layers_[i]->params();
    if (on_ready && !ps.empty()) on_ready(static_cast<int>(i), std::span<const std::size_t>(ps));
  }
  grads_zero_ = false;
}

void Model::zero_grad() {
  arena_.zero_grads();
  grads_zero_ = true;
}

std::vector<std::string> Model::layer_names() const {
  std::vector<std::string> out;
  for (auto& l : layers_) out.push_back(l->name());
  return out;
}

Shape Model::output_shape(std::int64_t batch) const {
  Shape s = {batch};
  s.insert(s.end(), sample_shape_.begin(), sample_shape_.end());
  for (auto& l : layers_) s = l->output_shape(s);
  return s;
}

std::vector<NamedBuffer> Model::buffers() const {
  std::vector<NamedBuffer> out;
  for (auto& l : layers_)
    for (auto& b : l->buffers()) out.push_back(b);
  return out;
}

std::string Model::summary() const {
  std::ostringstream os;
  Shape s = {1};
  s.insert(s.end(), sample_shape_.begin(), sample_shape_.end());
  os << "model " << name_ << " on " << device_.str() << ", input " << shape_str(s) << "\n";
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    s = layers_[i]->output_shape(s);
    std::int64_t n = 0;
    for (auto p : layers_[i]->params()) n += shape_numel(arena_.info(p).shape);
    os << "  " << i << " " << layers_[i]->name() << " (" << layers_[i]->type() << ") -> " << shape_str(s) << ", "
       << n << " params\n";
  }
  os << "  total " << arena_.numel() << " params";
  return os.str();
}

}  // namespace ringtrain
