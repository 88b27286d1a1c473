// The trainer's start-up report: the run's one-line description on rank 0,
// the precision actually used, and the metrics file's first record.
#include <nlohmann/json.hpp>

#include "ringtrain/core/log.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/comm/agree.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {
namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}

}  // namespace

// Reporter on rank 0; the metrics file gets this run's id and resume count on every record.
void Trainer::Impl::start_reporting() {
  std::string metrics = cfg.log.metrics;
  if (metrics.empty() && !cfg.checkpoint.dir.empty()) metrics = cfg.checkpoint.dir + "/metrics.jsonl";
  if (!hooks.report) metrics.clear();
  run_on_root(world, "opening log.metrics", [&] {
    if (ckpt.resumed()) ckpt.truncate_metrics(metrics);
    reporter = std::make_unique<Reporter>(hooks.report, cfg.log.format, cfg.log.interval, metrics, cfg.train.epochs,
                                          steps_per_epoch());
  });
  if (!reporter) reporter = std::make_unique<Reporter>(false, cfg.log.format, cfg.log.interval, "", cfg.train.epochs,
                                                       steps_per_epoch());
  reporter->set_run(pos.run_id, pos.resumes);
  reporter->set_tokens_per_sample(loader->info().tokens() ? cfg.data.seq_len : 0);
  if (world.rank() == 0 && hooks.report) {
    std::string grid_text;
    if (!layout.empty()) {
      std::string bal;
      for (int b : parts.balance) bal += cat(bal.empty() ? "" : ", ", b);
      std::string more;  // every other dimension in use (kDims), e.g. " x 2 CP"
      for (int i = 0; i < kMeshDims; ++i) {
        const Dim d = dim_at(i);
        if (d == Dim::pipeline || d == Dim::data || d == Dim::tensor || kDims[i].carved_from_data) continue;
        if (grid->mesh().size(d) > 1) more += cat(" x ", grid->mesh().size(d), " ", upper(kDims[i].short_name));
      }
      if (grid->cp_size() > 1 && cfg.parallel.context_mode == "alltoall") more += " (all-to-all)";
      grid_text = cat(" = ", grid->dp_size(), " DP x ", grid->pp_size(), " PP x ", grid->tp_size(), " TP", more,
                      " (layers [", bal,
                      "] per stage, schedule ", cfg.parallel.schedule, ", ", cfg.data.batch_size / (cfg.parallel.micro_batches > 0 ? cfg.parallel.micro_batches : cfg.parallel.pipeline),
                      "-sample micro-batches)");
    }
    const GridMemory mem = ringtrain::memory(parts);
    // ZeRO-3 keeps a 1/dp slice of every parameter: the stage's count is what a gathered bucket holds.
    const std::string here = cfg.parallel.zero == 3 && grid->dp_size() > 1
                                 ? cat("1/", grid->dp_size(), " of ", mem.param_count, " on this rank, gathered per bucket")
                                 : cat(mem.param_count, " on this rank");
    log::info("ringtrain: ", cfg.model.name, " (", num_params, " parameters; ", here, ") on ",
              world.size(), " rank(s)", grid_text, ", ", device.str(), ", ", cfg.train.precision, ", batch ",
              cfg.data.batch_size, "/rank (global ", global_batch(), "), ", steps_per_epoch(),
              " steps/epoch, all-reduce ", cfg.comm.algorithm, ", run ", pos.run_id,
              ckpt.resumed() ? cat(" (resume ", pos.resumes, " at epoch ", pos.epochs_done + 1, " step ",
                                   pos.step_in_epoch, ")") : std::string());
    if (cfg.train.precision == "bf16" || cfg.train.precision == "fp16") {  // which arithmetic really runs (issue 31)
      const bool bf = cfg.train.precision == "bf16", act16 = parts.stage->activation_dtype() != DType::f32;
      const std::string isa = bf ? backend_for(device).bf16_isa() : std::string();
      log::info("ringtrain: ", cfg.train.precision, ": ",
                act16 ? (bf ? "activations and Linear/Conv2d/attention weights in bfloat16, fp32 masters and gradients"
                            : "activations and Linear weights in float16, fp32 masters and gradients")
                      : cat("fp32 activations, ", cfg.train.precision, " down-conversion inside kernels only"),
                isa.empty() ? std::string() : cat("; bf16 math on ", isa), bf ? "" : "; dynamic loss scaling");
    }
    nlohmann::json head = {{"event", ckpt.resumed() ? "resume" : "start"}, {"model", cfg.model.name},
                           {"params", num_params}, {"ranks", world.size()}, {"device", device.str()},
                           {"pipeline", grid->pp_size()}, {"tensor", grid->tp_size()},
                           {"data_parallel", grid->dp_size()}, {"schedule", cfg.parallel.schedule},
                           {"precision", cfg.train.precision}, {"global_batch", global_batch()},
                           {"steps_per_epoch", steps_per_epoch()}, {"epochs_done", pos.epochs_done},
                           {"step", pos.step}, {"config", cfg.to_toml()}};
    reporter->json_line(head);
  }
}

}  // namespace ringtrain
