// The fixed-batch run of test_gpu_train_cnn on the CPU alone: `cnn`, SGD with
// momentum, kSteps steps on one batch. The loss must fall steadily (after the
// first three steps no step more than 5% above the one before) and end below
// 60% of where it started, so the GPU test's "tracks the CPU and falls" is
// asserted against a reference known to learn.
#include <gtest/gtest.h>

#include <vector>

#include "nn/fixed_batch.hpp"
#include "ringtrain/nn/backend.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
namespace fb = rt_fixed_batch;

TEST(CnnFixedBatch, CpuLossFallsUnderTheGpuTestSettings) {
  Stage model(fb::model_config(), Device::cpu());
  auto opt = make_optimizer(model.arena(), fb::optimizer_config());
  Tensor x = fb::images(), y = fb::labels();
  Tensor dl = Tensor::empty(model.output_shape(fb::kBatch));
  std::vector<double> loss;
  for (int s = 0; s < fb::kSteps; ++s) {
    model.zero_grads();
    Tensor z = model.forward(0, x, Mode::train);
    loss.push_back(backend_for(DeviceKind::cpu).softmax_xent(z, y, 0.0, dl));
    test_support::backward(model, dl);
    opt->step(fb::kLr);
  }
  for (int s = 3; s < fb::kSteps; ++s) EXPECT_LT(loss[s], 1.05 * loss[s - 1]) << "step " << s;
  EXPECT_LT(loss.back(), 0.6 * loss.front()) << "the fixed batch is not learned at lr " << fb::kLr;
}
