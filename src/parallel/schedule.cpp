#include "ringtrain/parallel/schedule.hpp"

#include <algorithm>
#include <deque>
#include <optional>

#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

enum class Compute { F, B, W, BW };  // BW: the unsplit backward (B then W, then send)
struct Step {
  Compute c;
  int mb;
};

std::vector<Step> afab(int m) {
  std::vector<Step> s;
  for (int i = 0; i < m; ++i) s.push_back({Compute::F, i});
  for (int i = 0; i < m; ++i) s.push_back({Compute::BW, i});
  return s;
}

std::vector<Step> one_f_one_b(int p, int m, int stage) {
  std::vector<Step> s;
  const int warm = std::min(p - stage - 1, m);
  auto b = [&](int i) { s.push_back({Compute::BW, i}); };
  for (int i = 0; i < warm; ++i) s.push_back({Compute::F, i});
  for (int i = 0; i < m - warm; ++i) {
    s.push_back({Compute::F, warm + i});
    b(i);
  }
  for (int i = m - warm; i < m; ++i) b(i);
  return s;
}

// The greedy of Qi et al. over unit-time F, B, W with free communication: all
// stages advance in lock-step time slots; a message sent in slot t is usable
// from slot t+1. Each stage records the order it ran things in.
std::vector<Step> zb_h1(int p, int m, int stage) {
  std::vector<std::vector<Step>> order(static_cast<std::size_t>(p));
  std::vector<int> nf(p, 0), nb(p, 0), nw(p, 0);
  // act_at[s][mb] / grad_at[s][mb]: first slot stage s may use the input / output gradient.
  const int never = 1 << 30;
  std::vector<std::vector<int>> act_at(p, std::vector<int>(m, never)), grad_at(p, std::vector<int>(m, never));
  for (int i = 0; i < m; ++i) act_at[0][i] = 0;
  int done = 0;
  for (int t = 0; done < p; ++t) {
    RT_ASSERT(t < 16 * (m + p) + 64);  // the greedy always progresses
    std::vector<std::pair<int, Step>> ran;
    for (int s = 0; s < p; ++s) {
      if (nw[s] == m) continue;
      const bool last = s == p - 1;
      std::optional<Step> run;
      if (nf[s] < m && act_at[s][nf[s]] <= t && nf[s] - nb[s] < p - s && nf[s] - nw[s] < p)
        run = Step{Compute::F, nf[s]};
      else if (nb[s] < nf[s] && (last || grad_at[s][nb[s]] <= t)) run = Step{Compute::B, nb[s]};
      else if (nw[s] < nb[s]) run = Step{Compute::W, nw[s]};
      if (!run) continue;
      ran.push_back({s, *run});
    }
    for (auto& [s, st] : ran) {
      order[s].push_back(st);
      if (st.c == Compute::F) {
        ++nf[s];
        if (s + 1 < p) act_at[s + 1][st.mb] = t + 1;
      } else if (st.c == Compute::B) {
        ++nb[s];
        if (s > 0) grad_at[s - 1][st.mb] = t + 1;
      } else {
        if (++nw[s] == m) ++done;
      }
    }
  }
  return order[static_cast<std::size_t>(stage)];
}

}  // namespace

ScheduleKind parse_schedule(const std::string& s) {
  if (s == "afab" || s == "gpipe") return ScheduleKind::afab;
  if (s == "1f1b") return ScheduleKind::one_f_one_b;
  if (s == "zb-h1" || s == "zbh1") return ScheduleKind::zb_h1;
  RT_FAIL("configuration key 'parallel.schedule': '", s, "' is not one of afab, 1f1b, zb-h1");
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::afab: return "afab";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::zb_h1: return "zb-h1";
  }
  return "?";
}

const char* op_name(Op op) {
  static const char* n[] = {"LoadMicroBatch", "Forward", "BackwardInput", "BackwardWeight",
                            "SendAct",        "RecvAct", "SendGrad",      "RecvGrad"};
  return n[static_cast<int>(op)];
}

std::vector<Instr> make_schedule(ScheduleKind kind, int p, int m, int stage) {
  RT_CHECK(p >= 1, "pipeline schedule: stages must be >= 1, got ", p);
  RT_CHECK(m >= 1, "pipeline schedule: micro-batches must be >= 1, got ", m);
  RT_CHECK(stage >= 0 && stage < p, "pipeline schedule: stage ", stage, " is not in [0, ", p, ")");
  std::vector<Step> steps = kind == ScheduleKind::afab          ? afab(m)
                            : kind == ScheduleKind::one_f_one_b ? one_f_one_b(p, m, stage)
                                                                : zb_h1(p, m, stage);
  const bool first = stage == 0, last = stage == p - 1;
  std::vector<Instr> out;
  for (const Step& s : steps) {
    switch (s.c) {
      case Compute::F:
        out.push_back({first ? Op::load_micro_batch : Op::recv_act, s.mb});
        out.push_back({Op::forward, s.mb});
        if (!last) out.push_back({Op::send_act, s.mb});
        break;
      case Compute::B:
      case Compute::BW:
        if (!last) out.push_back({Op::recv_grad, s.mb});
        out.push_back({Op::backward_input, s.mb});
        if (s.c == Compute::BW) out.push_back({Op::backward_weight, s.mb});
        if (!first) out.push_back({Op::send_grad, s.mb});
        break;
      case Compute::W: out.push_back({Op::backward_weight, s.mb}); break;
    }
  }
  return out;
}

std::string schedule_str(const std::vector<Instr>& s) {
  std::string out;
  for (const Instr& i : s) {
    const char* c = i.op == Op::forward ? "F" : i.op == Op::backward_input ? "B" : i.op == Op::backward_weight ? "W" : nullptr;
    if (!c) continue;
    out += cat(out.empty() ? "" : " ", c, i.mb);
  }
  return out;
}

int peak_in_flight(const std::vector<Instr>& s) {
  int live = 0, peak = 0;
  for (const Instr& i : s) {
    if (i.op == Op::forward) peak = std::max(peak, ++live);
    if (i.op == Op::backward_weight) --live;
  }
  return peak;
}

double analytic_bubble(ScheduleKind kind, int p, int m, double tf, double tb, double tw) {
  if (kind == ScheduleKind::zb_h1) {
    const double idle = (p - 1) * std::max(0.0, tf + tb - tw);
    return idle / (m * (tf + tb + tw) + idle);
  }
  return double(p - 1) / double(m + p - 1);
}

}  // namespace ringtrain
