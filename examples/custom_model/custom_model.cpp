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

#include <memory>
#include <vector>

namespace {

using namespace ringtrain;

std::vector<LayerPtr> tinynet(const ModelConfig& c) {
  const std::int64_t ch = c.base_width, hidden = 4 * ch, features = 2 * ch;
  RT_CHECK(c.height % 2 == 0 && c.width % 2 == 0, "model 'tinynet': the image size must be even, got ", c.height,
           "x", c.width);
  check_tensor_divides(ch, "model.width", c.tensor, "tinynet");  // also divides hidden = 4 ch

  // split_layer builds the plain layer at tensor size 1 and this rank's column-
  // or row-parallel part of it over cfg.tensor otherwise: the same parameters
  // (the parallel ones hold this rank's shard) and the same initial values.
  std::vector<LayerPtr> L;
  Conv2dSpec s1 = Conv2dSpec::square(c.in_channels, ch, 3, 1, true);
  s1.fuse_relu = true;
  // column: ch/T filters per rank
  L.push_back(split_layer("conv1", s1, Init::kaiming_normal, TensorSplit::column, c.tensor));
  Conv2dSpec s2 = Conv2dSpec::square(ch, ch, 3, 1, true);
  s2.fuse_relu = true;
  // row: ch/T input channels, outputs all-reduced
  L.push_back(split_layer("conv2", s2, Init::kaiming_normal, TensorSplit::row, c.tensor));
  L.push_back(std::make_unique<Pool2d>("pool", Pool2dSpec{}));
  L.push_back(std::make_unique<Flatten>("flatten"));
  L.push_back(std::make_unique<Linear>("fc", LinearSpec{ch * (c.height / 2) * (c.width / 2), features, true, true},
                                       Init::kaiming_normal));  // replicated on the tensor ranks

  // A residual MLP block: ONE top-level layer, so a pipeline never splits it.
  std::vector<LayerPtr> body;
  body.push_back(split_layer("up", LinearSpec{features, hidden, true, true}, Init::kaiming_normal,
                             TensorSplit::column, c.tensor));
  body.push_back(split_layer("down", LinearSpec{hidden, features, true, false}, Init::kaiming_normal,
                             TensorSplit::row, c.tensor));
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
