// A program with a model of its own, trained by ringtrain's whole command line:
// register the model's builder, then hand over to ringtrain::main. Everything
// `ringtrain` does works with it (TOML, --set, checkpoints, --resume auto,
// metrics, eval, data x pipeline x tensor layouts):
//   custom_model prepare --dataset synthetic --channels 3 --height 12 --width 12 --out data
//   mpirun -np 2 custom_model train --config tinynet.toml --set parallel.tensor=2
//
// "tinynet": conv -> conv -> max pool -> fc -> residual MLP block -> head.
// With parallel.tensor = T the convolutions and the MLPs are split Megatron
// style over cfg.tensor (column-parallel then row-parallel: one all-reduce
// each way per pair); the head is replicated. model.width sets the channels
// (and the MLP's width is 4x that), model.dropout adds dropout before the head.
#include <ringtrain/cli/main.hpp>
#include <ringtrain/core/error.hpp>
#include <ringtrain/nn/layers.hpp>
#include <ringtrain/nn/model_registry.hpp>
#include <ringtrain/nn/tensor_parallel.hpp>
#include <ringtrain/nn/tensor_parallel_conv.hpp>

#include <memory>
#include <vector>

namespace {

using namespace ringtrain;

// The unsplit layer at tensor size 1, its column- or row-parallel form over cfg.tensor otherwise:
// the same parameters (the parallel ones hold this rank's shard) and the same initial values.
LayerPtr conv(const ModelConfig& c, const char* name, Conv2dSpec s, bool column) {
  if (c.tensor.size == 1) return std::make_unique<Conv2d>(name, s);
  if (column) return std::make_unique<ColumnParallelConv2d>(name, s, Init::kaiming_normal, c.tensor);
  return std::make_unique<RowParallelConv2d>(name, s, Init::kaiming_normal, c.tensor);
}

LayerPtr linear(const ModelConfig& c, const char* name, LinearSpec s, bool column) {
  if (c.tensor.size == 1) return std::make_unique<Linear>(name, s, Init::kaiming_normal);
  if (column) return std::make_unique<ColumnParallelLinear>(name, s, Init::kaiming_normal, c.tensor);
  return std::make_unique<RowParallelLinear>(name, s, Init::kaiming_normal, c.tensor);
}

std::vector<LayerPtr> tinynet(const ModelConfig& c) {
  const std::int64_t ch = c.base_width, hidden = 4 * ch, features = 2 * ch;
  RT_CHECK(c.height % 2 == 0 && c.width % 2 == 0, "model 'tinynet': the image size must be even, got ", c.height,
           "x", c.width);
  check_tensor_divides(ch, "model.width", c.tensor, "tinynet");  // also divides hidden = 4 ch

  std::vector<LayerPtr> L;
  Conv2dSpec s1 = Conv2dSpec::square(c.in_channels, ch, 3, 1, true);
  s1.fuse_relu = true;
  L.push_back(conv(c, "conv1", s1, true));  // column: ch/T filters per rank
  Conv2dSpec s2 = Conv2dSpec::square(ch, ch, 3, 1, true);
  s2.fuse_relu = true;
  L.push_back(conv(c, "conv2", s2, false));  // row: ch/T input channels, outputs all-reduced
  L.push_back(std::make_unique<Pool2d>("pool", Pool2dSpec{}));
  L.push_back(std::make_unique<Flatten>("flatten"));
  L.push_back(std::make_unique<Linear>("fc", LinearSpec{ch * (c.height / 2) * (c.width / 2), features, true, true},
                                       Init::kaiming_normal));  // replicated on the tensor ranks

  // A residual MLP block: ONE top-level layer, so a pipeline never splits it.
  std::vector<LayerPtr> body;
  body.push_back(linear(c, "up", LinearSpec{features, hidden, true, true}, true));
  body.push_back(linear(c, "down", LinearSpec{hidden, features, true, false}, false));
  L.push_back(std::make_unique<Residual>("block", std::move(body), std::vector<LayerPtr>{}, true));

  if (c.dropout > 0) L.push_back(std::make_unique<Dropout>("dropout", c.dropout));
  L.push_back(std::make_unique<Linear>("head", LinearSpec{features, c.classes, true, false}, Init::xavier_uniform));
  return L;
}

}  // namespace

int main(int argc, char** argv) {
  ringtrain::register_model("tinynet", tinynet);
  return ringtrain::main(argc, argv);
}
