// Training-step time on the GPU for `cnn`, `resnet` (ResNet-20, 32x32x3) and
// `vit` (width 512, depth 8, heads 8, patch 4 on 28x28) at batch 256, and
// `gpt` (the GPT-2 124M shape: width 768, depth 12, 12 heads, 1024 tokens,
// vocabulary 50304) at batch 8, next to PyTorch eager on the same GPU, model
// and batch, in one invocation:
//   bench_gpu_train_step [--models cnn,resnet,vit,gpt] [--precisions fp32,tf32,bf16,fp16]
//                        [--batch 256] [--gpt-batch 8] [--iters 30] [--reference DIR] [--out results.json]
// A step = zero_grad, forward, softmax cross-entropy (loss read back to the
// host, as PyTorch's loss.item()), backward, SGD(momentum 0.9) update.
// fp32 is strict fp32 on both sides (TF32 off); tf32 lets both use TF32
// tensor cores for fp32 data. bf16/fp16: PyTorch autocast (half activations
// and weight copies, fp32 master weights; fp16 adds GradScaler) next to
// ringtrain's MathMode (fp32 storage, half tensor-core math inside cuBLAS and
// cuDNN) — the same numerics class, not the same memory traffic. Where a model
// stores 16-bit activations (vit, mlp: what jobs do since the H200 run put it
// on the GPU validation gate's list), that path is timed beside the float32
// storage one as "ringtrain_16bit_storage".
// MFU: the model's FLOPs per step (model_flops_per_sample x batch: forward
// and the two backward products) over the step time, against the card's dense
// bf16 tensor-core peak from its data sheet (H100/H200 SXM 989 TFLOP/s, H100
// PCIe 756, A100 312; another card: not printed).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ringtrain/cuda/backend.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/memory.hpp"
#include "ringtrain/cuda/optim.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/stage.hpp"

using namespace ringtrain;
using json = nlohmann::json;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

ModelConfig config_for(const std::string& name) {
  ModelConfig mc;
  mc.name = name;
  if (name == "resnet") {  // CIFAR-10 shape, ResNet-20
    mc.in_channels = 3;
    mc.height = mc.width = 32;
  } else if (name == "vit") {  // 7x7 patches of 4x4 on 28x28: 49 tokens of width 512
    mc.base_width = 512;
    mc.depth = 8;
    mc.heads = 8;
  } else if (name == "gpt") {  // the GPT-2 124M shape (vocabulary padded to a multiple of 128, as llm.c)
    mc.base_width = 768;
    mc.depth = 12;
    mc.heads = 12;
    mc.seq_len = 1024;
    mc.classes = 50304;
  }
  return mc;
}

// The card's dense (no sparsity) bf16 tensor-core peak, FLOP/s; 0 when the name is not known.
double dense_bf16_peak(const std::string& card) {
  auto has = [&](const char* s) { return card.find(s) != std::string::npos; };
  if (has("H200") || (has("H100") && (has("SXM") || has("HBM3")))) return 989.4e12;
  if (has("H100")) return 756.0e12;  // PCIe
  if (has("A100")) return 312.0e12;
  return 0;
}

json ringtrain_step(ModelConfig mc, const std::string& prec, int batch, int warmup, int iters, bool storage16) {
  mc.math = parse_math_mode(prec);
  mc.storage16 = storage16;
  Device dev = Device::cuda(0);
  Stage model(mc, dev);
  if (storage16 && model.activation_dtype() == DType::f32) return {};  // no 16-bit storage for this model
  model.set_fused_backward(true);  // each layer's whole backward, gradients overwritten after zero_grads
  OptimizerConfig oc;
  oc.momentum = 0.9;
  auto& ctx = cuda::backend_context(0);
  cuda::DeviceOptimizer opt(model.arena(), oc, ctx);
  const bool lm = mc.seq_len > 0;  // gpt: token ids in, one label per token
  Tensor x = lm ? Tensor::empty({batch, mc.seq_len}) : Tensor::empty({batch, mc.in_channels, mc.height, mc.width});
  Tensor y = lm ? Tensor::empty({batch, mc.seq_len}, DType::i32) : Tensor::empty({batch}, DType::i32);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = lm ? float((i * 2654435761u) % std::uint64_t(mc.classes))
                            : static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data<std::int32_t>()[i] = std::int32_t((i * 40503u) % mc.classes);
  Tensor xg = x.to(dev), yg = y.to(dev);
  Tensor dl = Tensor::empty(model.output_shape(batch), DType::f32, dev);
  std::vector<double> ms;
  double loss = 0.0;
  std::uint64_t mallocs = 0;
  for (int it = 0; it < warmup + iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    model.zero_grads();
    Tensor z = model.forward(0, xg, Mode::train);
    loss = softmax_cross_entropy(z, yg, 0.0, dl);
    model.backward_input(0, dl, false);
    opt.step(0.01);
    ctx.sync_compute();
    double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (it == warmup - 1) mallocs = cuda::device_allocator().stats().device_mallocs;
    if (it >= warmup) ms.push_back(t);
  }
  return {{"median_ms", median(ms)},
          {"min_ms", *std::min_element(ms.begin(), ms.end())},
          {"final_loss", loss},
          {"mallocs_in_timed_steps", cuda::device_allocator().stats().device_mallocs - mallocs},
          {"activations", dtype_name(model.activation_dtype())}};
}

json torch_step(const std::string& ref, const ModelConfig& mc, int batch, const std::string& precision, int warmup,
                int iters) {
  std::ostringstream cmd;
  cmd << "python3 " << ref << "/torch_gpu_step.py --model " << mc.name << " --batch " << batch << " --precision "
      << precision << " --warmup " << warmup << " --iters " << iters << " --in-channels " << mc.in_channels
      << " --size " << mc.height << " --classes " << mc.classes << " --depth " << mc.depth << " --width "
      << mc.base_width << " --heads " << mc.heads << " --patch " << mc.patch << " --mlp-ratio " << mc.mlp_ratio
      << " --seq-len " << mc.seq_len << " 2>&1";
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return {{"error", "popen failed"}};
  std::string out, last;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) {
    out += buf;
    std::string line(buf);
    if (!line.empty() && line[0] == '{') last = line;
  }
  int rc = pclose(p);
  if (last.empty()) return {{"error", "no JSON from PyTorch (rc " + std::to_string(rc) + "): " + out.substr(0, 300)}};
  try {
    return json::parse(last);
  } catch (const std::exception& e) {
    return {{"error", std::string("bad JSON from PyTorch: ") + e.what()}};
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row reaches the log even when a time limit kills the run
  CLI::App app{"ringtrain vs PyTorch: GPU training-step time"};
  std::string models = "cnn,resnet,vit", precisions = "fp32,tf32,bf16,fp16", out, ref;
  int images_batch = 256, gpt_batch = 8, iters = 30, warmup = 5;
  bool no_torch = false;
  app.add_option("--models", models, "comma-separated: cnn,resnet,vit,mlp,gpt");
  app.add_option("--gpt-batch", gpt_batch, "gpt's batch (sequences of 1024 tokens)")->check(CLI::PositiveNumber);
  app.add_option("--precisions", precisions, "comma-separated: fp32,tf32,bf16,fp16");
  app.add_option("--batch", images_batch, "batch size of the image models")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::PositiveNumber);
  app.add_option("--reference", ref, "directory of torch_gpu_step.py (default: $RINGTRAIN_SOURCE_DIR/bench/reference)");
  app.add_option("--out", out, "write results as JSON here");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  CLI11_PARSE(app, argc, argv);
  if (ref.empty()) {
    const char* src = std::getenv("RINGTRAIN_SOURCE_DIR");
    ref = std::string(src ? src : ".") + "/bench/reference";
  }
  if (!cuda::available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;  // not a failure: the benchmark has nothing to measure here
  }
  json results = json::array();
  const std::string card = cuda::backend_context(0).props().name;
  const double peak = dense_bf16_peak(card);
  std::printf("# %s: dense bf16 peak %s\n", card.c_str(),
              peak > 0 ? (std::to_string(static_cast<int>(peak / 1e12)) + " TFLOP/s (MFU against it)").c_str()
                       : "unknown (no MFU)");
  std::printf("%-8s %-5s %6s %14s %14s %10s %7s\n", "model", "prec", "batch", "ringtrain ms", "pytorch ms", "rt/torch",
              "MFU");
  std::stringstream ss(models);
  for (std::string name; std::getline(ss, name, ',');) {
    ModelConfig mc = config_for(name);
    const int batch = mc.seq_len > 0 ? gpt_batch : images_batch;
    const double step_flops = model_flops_per_sample(mc) * batch;
    auto mfu = [&](double ms) { return peak > 0 && ms > 0 ? step_flops / (ms * 1e-3) / peak : 0.0; };
    auto mfu_text = [&](double ms) { return peak > 0 && ms > 0 ? std::to_string(100 * mfu(ms)).substr(0, 4) + "%" : std::string("-"); };
    std::stringstream ps(precisions);
    for (std::string prec; std::getline(ps, prec, ',');) {
      json r = {{"model", name}, {"precision", prec}, {"batch", batch}};
      try {
        r["ringtrain"] = ringtrain_step(mc, prec, batch, warmup, iters, false);
      } catch (const std::exception& e) {
        r["ringtrain"] = {{"error", e.what()}};
      }
      if (prec == "bf16" || prec == "fp16") {
        try {
          json s16 = ringtrain_step(mc, prec, batch, warmup, iters, true);
          if (!s16.is_null()) r["ringtrain_16bit_storage"] = s16;
        } catch (const std::exception& e) {
          r["ringtrain_16bit_storage"] = {{"error", e.what()}};
        }
      }
      if (!no_torch) r["pytorch"] = torch_step(ref, mc, batch, prec, warmup, iters);
      auto ms = [](const json& j) { return j.contains("median_ms") ? j["median_ms"].get<double>() : -1.0; };
      double a = ms(r["ringtrain"]), b = r.contains("pytorch") ? ms(r["pytorch"]) : -1.0;
      std::printf("%-8s %-5s %6d %14.3f %14.3f %10s %7s\n", name.c_str(), prec.c_str(), batch, a, b,
                  a > 0 && b > 0 ? std::to_string(a / b).substr(0, 5).c_str() : "-", mfu_text(a).c_str());
      if (a > 0) r["ringtrain"]["mfu"] = mfu(a);
      r["model_flops_per_step"] = step_flops;
      if (r.contains("ringtrain_16bit_storage")) {
        const double c = ms(r["ringtrain_16bit_storage"]);
        std::printf("%-8s %-5s %6d %14.3f %14s %10s %7s   (16-bit activation storage)\n", name.c_str(), prec.c_str(),
                    batch, c, "", b > 0 && c > 0 ? std::to_string(c / b).substr(0, 5).c_str() : "", mfu_text(c).c_str());
        if (c > 0) r["ringtrain_16bit_storage"]["mfu"] = mfu(c);
      }
      for (const char* side : {"ringtrain", "ringtrain_16bit_storage", "pytorch"})
        if (r.contains(side) && r[side].contains("error"))
          std::printf("    %s: %s\n", side, r[side]["error"].get<std::string>().c_str());
      results.push_back(r);
    }
  }
  if (!out.empty()) std::ofstream(out) << results.dump(2) << "\n";
  return 0;
}
