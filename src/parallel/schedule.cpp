// The built-in schedules' compute tables (schedule.hpp).
#include "ringtrain/parallel/schedule.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/simulator.hpp"

namespace ringtrain {
namespace {

using Order = std::vector<Action>;

Order afab(int m) {
  Order s;
  for (int i = 0; i < m; ++i) s.push_back({Op::forward, 0, i});
  for (int i = 0; i < m; ++i) s.push_back({Op::backward, 0, i});
  return s;
}

Order one_f_one_b(int p, int m, int r) {
  Order s;
  const int warm = std::min(p - r - 1, m);
  for (int i = 0; i < warm; ++i) s.push_back({Op::forward, r, i});
  for (int i = 0; i < m - warm; ++i) {
    s.push_back({Op::forward, r, warm + i});
    s.push_back({Op::backward, r, i});
  }
  for (int i = m - warm; i < m; ++i) s.push_back({Op::backward, r, i});
  for (Action& a : s) a.stage = r;
  return s;
}

// Megatron-Core's interleaved 1F1B: the k-th forward of a rank runs chunk
// (k / p) mod v on micro-batch (k / (p·v))·p + k mod p; backwards walk the
// chunks in reverse.
Order interleaved(const PipelineLayout& L, int m, int r) {
  const int p = L.ranks, v = L.chunks, total = m * v;
  auto item = [&](int k, bool fwd) {
    const int c = (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    return Action{fwd ? Op::forward : Op::backward, L.stage_of(r, fwd ? c : v - 1 - c), mb};
  };
  const int warm = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  Order s;
  int f = 0, b = 0;
  for (; f < warm; ++f) s.push_back(item(f, true));
  while (f < total) {
    s.push_back(item(f++, true));
    s.push_back(item(b++, false));
  }
  while (b < total) s.push_back(item(b++, false));
  return s;
}

// The zero-bubble greedy, played in time with the stages' F, I, W costs and
// the messages between ranks (unit costs and free messages: lock-step slots,
// a result made in slot t usable from slot t+1). Each rank, whenever it is
// free, runs in this order of preference:
//  - a ready F, while the rank holds fewer than `mem` chunk activations (F
//    done, W not) and, on one chunk per rank, fewer than p-r micro-batches
//    between F and I (1F1B's pacing, which keeps the I critical path short);
//  - else a ready I (the oldest micro-batch, the later stage first);
//  - else the oldest pending W;
//  - else it waits for the next result that concerns it.
// Ranks are served in the order they become free (the lower rank on a tie),
// so whatever another rank finished by then is known.
std::vector<Order> zero_bubble(const PipelineLayout& L, int m, const SimCosts& costs) {
  const int p = L.ranks, S = L.stages(), v = L.chunks;
  const int mem = p * v;
  constexpr double never = std::numeric_limits<double>::infinity();
  auto cost = [&](Op op, int g) {
    const StageCost& c = costs.of(g);
    return op == Op::forward ? c.f : op == Op::backward_input ? c.i : c.w;
  };
  // A result of stage g for stage h: free on the same rank, else the message across their boundary.
  auto hand_over = [&](int g, int h) { return L.rank_of(g) == L.rank_of(h) ? 0.0 : costs.message_s(std::min(g, h)); };
  std::vector<Order> order(static_cast<std::size_t>(p));
  std::vector<int> nf(S, 0), ni(S, 0), nw(S, 0), live(p, 0), left(p, 0);
  std::vector<std::vector<double>> act_at(S, std::vector<double>(m, never)), grad_at(S, std::vector<double>(m, never));
  for (int i = 0; i < m; ++i) act_at[0][i] = 0;
  std::vector<double> free_at(p, 0);
  std::vector<bool> waiting(p, false);
  for (int g = 0; g < S; ++g) left[L.rank_of(g)] += 3 * m;
  for (std::size_t steps = 0;; ++steps) {
    RT_ASSERT(steps < static_cast<std::size_t>(64 * (m + S) * v * p + 64));  // the greedy always progresses
    int r = -1;  // the first free, a rank that found nothing at that time after the others
    for (int j = 0; j < p; ++j)
      if (left[j] > 0 && (r < 0 || std::pair(free_at[j], waiting[j]) < std::pair(free_at[r], waiting[r]))) r = j;
    if (r < 0) break;
    const double t = free_at[r];
    std::optional<Action> run;
    double next = never;
    // F: the oldest ready micro-batch (the later stage on a tie). A chunk
    // before the rank's last leaves the last one activation: its forward is
    // what frees the others (by their backwards).
    for (int k = v; k-- > 0 && live[r] < mem;) {
      const int g = L.stage_of(r, k);
      if (nf[g] >= m || (v == 1 && nf[g] - ni[g] >= p - r) || (k + 1 < v && live[r] + 1 >= mem)) continue;
      if (act_at[g][nf[g]] > t) continue;
      if (!run || nf[g] < run->mb) run = Action{Op::forward, g, nf[g]};
    }
    for (int k = v; k-- > 0 && !run;) {
      const int g = L.stage_of(r, k);
      if (ni[g] >= nf[g]) continue;
      if (g == S - 1 || grad_at[g][ni[g]] <= t) run = Action{Op::backward_input, g, ni[g]};
    }
    for (int k = v; k-- > 0 && !run;) {
      const int g = L.stage_of(r, k);
      if (nw[g] < ni[g]) run = Action{Op::backward_weight, g, nw[g]};
    }
    if (!run) {  // idle: after any other rank free now, else until the next result or free rank
      bool other_now = false;
      for (int j = 0; j < p; ++j) {
        if (j == r || left[j] == 0) continue;
        other_now |= free_at[j] == t && !waiting[j];
        if (free_at[j] > t) next = std::min(next, free_at[j]);
      }
      for (int g = 0; g < S; ++g)
        for (int i = 0; i < m; ++i)
          for (double x : {act_at[g][i], grad_at[g][i]})
            if (x > t) next = std::min(next, x);
      waiting[r] = other_now;
      if (!other_now) {
        RT_ASSERT(next < never);  // the rules above leave the last chunk room: some rank always moves on
        free_at[r] = next;
      }
      continue;
    }
    std::fill(waiting.begin(), waiting.end(), false);  // what they wait for may be on its way now
    const Action a = *run;
    const int g = a.stage;
    const double end = t + cost(a.op, g);
    order[static_cast<std::size_t>(r)].push_back(a);
    free_at[r] = end;
    --left[r];
    if (a.op == Op::forward) {
      ++nf[g];
      ++live[r];
      if (g + 1 < S) act_at[g + 1][a.mb] = end + hand_over(g, g + 1);
    } else if (a.op == Op::backward_input) {
      ++ni[g];
      if (g > 0) grad_at[g - 1][a.mb] = end + hand_over(g, g - 1);
    } else {
      --live[r];
      ++nw[g];
    }
  }
  return order;
}

// A first stage's input gradient goes nowhere, so where the table runs its W
// right after its I, a whole backward (B) does the same work at no cost to any
// other rank, without the split's reading of the activations again.
void fuse_first_stage(std::vector<Order>& order) {
  for (Order& o : order)
    for (std::size_t j = 0; j + 1 < o.size(); ++j) {
      const Action& a = o[j];
      const Action& n = o[j + 1];
      if (a.op == Op::backward_input && a.stage == 0 && n.op == Op::backward_weight && n.stage == 0 && n.mb == a.mb) {
        o[j].op = Op::backward;
        o.erase(o.begin() + static_cast<std::ptrdiff_t>(j + 1));
      }
    }
}

}  // namespace

ScheduleKind parse_schedule(const std::string& s) {
  if (s == "afab" || s == "gpipe") return ScheduleKind::afab;
  if (s == "1f1b") return ScheduleKind::one_f_one_b;
  if (s == "zb-h1" || s == "zbh1") return ScheduleKind::zb_h1;
  if (s == "interleaved" || s == "interleaved-1f1b") return ScheduleKind::interleaved;
  if (s == "zb-v" || s == "zbv") return ScheduleKind::zb_v;
  if (s == "auto") return ScheduleKind::automatic;
  if (s.size() > 4 && s.compare(s.size() - 4, 4, ".csv") == 0) return ScheduleKind::file;
  RT_FAIL("configuration key 'parallel.schedule': '", s,
          "' is not one of afab, 1f1b, zb-h1, interleaved, zb-v, auto or a table FILE.csv");
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::afab: return "afab";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::zb_h1: return "zb-h1";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zb_v: return "zb-v";
    case ScheduleKind::file: return "file";
    case ScheduleKind::automatic: return "auto";
  }
  return "?";
}

int PipelineLayout::rank_of(int stage) const {
  const int k = stage / ranks, i = stage % ranks;
  return placement == ChunkPlacement::v && k % 2 == 1 ? ranks - 1 - i : i;
}

int PipelineLayout::stage_of(int rank, int chunk) const {
  return chunk * ranks + (placement == ChunkPlacement::v && chunk % 2 == 1 ? ranks - 1 - rank : rank);
}

PipelineLayout layout_for(ScheduleKind kind, int ranks, int virtual_stages) {
  RT_CHECK(ranks >= 1, "pipeline schedule: ranks must be >= 1, got ", ranks);
  if (kind == ScheduleKind::zb_v) return {ranks, 2, ChunkPlacement::v};
  if (kind == ScheduleKind::interleaved) return {ranks, virtual_stages, ChunkPlacement::loop};
  return {ranks, 1, ChunkPlacement::loop};
}

Schedule make_schedule(ScheduleKind kind, int p, int m, int virtual_stages) {
  return make_schedule(kind, p, m, virtual_stages, SimCosts{});
}

Schedule make_schedule(ScheduleKind kind, int p, int m, int virtual_stages, const SimCosts& costs) {
  RT_CHECK(p >= 1, "pipeline schedule: stages must be >= 1, got ", p);
  RT_CHECK(m >= 1, "pipeline schedule: micro-batches must be >= 1, got ", m);
  RT_CHECK(kind != ScheduleKind::file, "pipeline schedule: a table from a file is read, not made");
  RT_CHECK(kind != ScheduleKind::automatic, "parallel.schedule = auto is resolved at start from the model's layer "
           "times (pick_schedule); name a schedule to make its table");
  if (kind == ScheduleKind::interleaved) {
    RT_CHECK(virtual_stages >= 2, "parallel.schedule = interleaved needs parallel.virtual_stages >= 2, got ",
             virtual_stages);
    RT_CHECK(m % p == 0, "parallel.schedule = interleaved runs micro-batches in rounds of parallel.pipeline = ", p,
             ": the micro-batches per step (parallel.micro_batches x train.accumulation = ", m,
             ") must be a multiple of ", p);
  }
  Schedule s;
  s.layout = layout_for(kind, p, virtual_stages);
  s.micro_batches = m;
  s.ranks.resize(static_cast<std::size_t>(p));
  if (kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_v) {
    RT_CHECK(costs.stage.empty() || static_cast<int>(costs.stage.size()) == s.layout.stages(),
             "pipeline schedule: costs for ", costs.stage.size(), " stages, the table has ", s.layout.stages());
    s.ranks = zero_bubble(s.layout, m, costs);
    fuse_first_stage(s.ranks);
    return s;
  }
  for (int r = 0; r < p; ++r) {
    Order o = kind == ScheduleKind::afab          ? afab(m)
              : kind == ScheduleKind::one_f_one_b ? one_f_one_b(p, m, r)
                                                  : interleaved(s.layout, m, r);
    if (kind == ScheduleKind::afab)
      for (Action& a : o) a.stage = r;
    s.ranks[static_cast<std::size_t>(r)] = std::move(o);
  }
  return s;
}

Schedule step_schedule(ScheduleKind kind, const std::string& file, int p, int m, int virtual_stages) {
  if (kind != ScheduleKind::file) return make_schedule(kind, p, m, virtual_stages);
  Schedule s = read_schedule_csv(file, p);
  RT_CHECK(s.micro_batches == m, "parallel.schedule = ", file, ": the table runs ", s.micro_batches,
           " micro-batches per step, the job ", m, " (parallel.micro_batches x train.accumulation)");
  return s;
}

PipelineLayout schedule_layout(ScheduleKind kind, const std::string& file, int p, int virtual_stages) {
  return kind == ScheduleKind::file ? read_schedule_csv(file, p).layout : layout_for(kind, p, virtual_stages);
}

bool Schedule::split_backward() const {
  for (const auto& r : ranks)
    for (const Action& a : r)
      if (a.op == Op::backward_input || a.op == Op::backward_weight) return true;
  return false;
}

}  // namespace ringtrain
