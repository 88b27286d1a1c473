#include "ringtrain/parallel/simulator.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <tuple>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/partition.hpp"

namespace ringtrain {

const StageCost& SimCosts::of(int g) const {
  static const StageCost unit;
  return stage.empty() ? unit : stage.at(static_cast<std::size_t>(g));
}

double SimCosts::message_s(int g) const {
  const auto i = static_cast<std::size_t>(g);
  return link.time(i < boundary_bytes.size() ? boundary_bytes[i] : 0.0);
}

double SimResult::mean_bubble() const {
  if (busy.empty()) return 0;
  double s = 0;
  for (std::size_t r = 0; r < busy.size(); ++r) s += bubble(static_cast<int>(r));
  return s / static_cast<double>(busy.size());
}

std::vector<double> step_makespans(const Schedule& in, const std::vector<SimCosts>& steps) {
  std::vector<double> out;
  if (steps.empty()) return out;
  const Schedule s = lower(in);
  for (const SimCosts& c : steps) out.push_back(simulate(s, c).makespan);
  return out;
}

double mean_makespan(const Schedule& in, const std::vector<SimCosts>& steps) {
  const std::vector<double> t = step_makespans(in, steps);
  double sum = 0;
  for (double x : t) sum += x;
  return t.empty() ? 0 : sum / static_cast<double>(t.size());
}

double busiest_rank_s(const Schedule& s, const SimCosts& costs) {
  double most = 0;
  for (const auto& list : s.ranks) {
    double busy = 0;
    for (const Action& a : list) {
      const StageCost& c = costs.of(a.stage);
      if (a.op == Op::forward) busy += c.f;
      if (a.op == Op::backward || a.op == Op::backward_input) busy += std::min(c.b(), c.i + c.w);
    }
    most = std::max(most, busy);
  }
  return most;
}

SimResult simulate(const Schedule& in, const SimCosts& costs) {
  const Schedule s = lower(in);
  const PipelineLayout& L = s.layout;
  const int p = L.ranks, v = L.chunks;
  const auto P = static_cast<std::size_t>(p);
  SimResult r;
  r.busy.assign(P, 0);
  r.peak.assign(P, 0);
  r.started.resize(P);
  std::vector<std::size_t> pc(P, 0);
  std::vector<double> clock(P, 0);
  std::vector<int> live(P, 0);
  std::vector<bool> done(P, false);
  // A message: (receiving stage, 0 = activation | 1 = gradient, micro-batch)
  // -> when the receiver may have it and, for a rendezvous, the copy it then
  // makes inside MPI (bytes / bandwidth of the link's time).
  struct Message {
    double at = 0, copy = 0;
  };
  std::map<std::tuple<int, int, int>, Message> arrives;
  // Per rank, its compute intervals and its waits in MPI so far: it drives
  // MPI (takes a rendezvous message) only outside the first, copies in the second.
  std::vector<std::vector<std::pair<double, double>>> computing(P), in_mpi(P);
  std::vector<double> copied_until(P, 0);  // a rank copies one message at a time
  auto wait_until = [&](std::size_t k, double t) {
    if (t <= clock[k]) return;
    in_mpi[k].push_back({clock[k], t});
    clock[k] = t;
  };
  // When rank k, in its receive at its clock, has message m: a rendezvous
  // copy runs in k's waits since m was offered (after its earlier copies),
  // and what is left of it now (Open MPI's single-copy get: the receiver
  // reads the sender's buffer when it is in MPI; measured on cnn's 12.8 MB
  // activations, docs/parallel_layouts.md).
  auto received_at = [&](std::size_t k, const Message& m) {
    if (m.copy <= 0) return m.at;
    double need = m.copy, from = std::max(m.at, copied_until[k]), got = 0;
    for (const auto& [a, b] : in_mpi[k]) {
      if (b <= from) continue;
      const double s = std::max(a, from), take = std::min(b - s, need);
      need -= take;
      got = s + take;
      if (need <= 0) break;
    }
    if (need > 0) got = std::max(clock[k], from) + need;
    copied_until[k] = got;
    return got;
  };
  auto progresses_at = [&](int j, double t) {
    for (auto it = computing[static_cast<std::size_t>(j)].rbegin(); it != computing[static_cast<std::size_t>(j)].rend(); ++it) {
      if (it->second <= t) break;
      if (it->first <= t) return it->second;
    }
    return t;
  };
  // The executor's slots (executor.cpp): per chunk a list in the order freed;
  // a forward takes the first whose sends have completed (else the first,
  // once they have), a B or W gives it back.
  const std::vector<std::vector<int>> peaks = peak_in_flight_per_chunk(s);
  std::vector<int> slots(P, 1);
  std::vector<std::vector<std::vector<int>>> free_slots(P), slot_of(P);
  std::vector<std::vector<double>> sent(P);  // per rank, chunk x slot: when the slot's sends complete
  for (std::size_t k = 0; k < P; ++k) {
    for (int x : peaks[k]) slots[k] = std::max(slots[k], x);
    free_slots[k].resize(static_cast<std::size_t>(v));
    for (auto& f : free_slots[k])
      for (int j = 0; j < slots[k]; ++j) f.push_back(j);
    slot_of[k].assign(static_cast<std::size_t>(v), std::vector<int>(static_cast<std::size_t>(s.micro_batches), 0));
    sent[k].assign(static_cast<std::size_t>(v * slots[k]), 0.0);
  }
  // Rank k posts a message at c across `boundary` to the rank of stage `to`.
  // Eager: the receiver has it one message time later, the send is complete.
  // Rendezvous: one latency later the receiver may take it, copying the
  // bytes itself inside MPI (received_at); the send completes then, taken
  // here as once the receiver is out of the compute it is in (its receives
  // are posted up front) and has copied.
  auto post = [&](std::size_t k, int chunk, int mb, std::tuple<int, int, int> msg, int boundary, int to, double c) {
    const double whole = costs.message_s(boundary);
    const auto b = static_cast<std::size_t>(boundary);
    if ((b < costs.boundary_bytes.size() ? costs.boundary_bytes[b] : 0.0) > costs.eager_bytes) {
      const double copy = std::max(0.0, whole - costs.link.latency_s), at = c + whole - copy;
      auto& done_at = sent[k][static_cast<std::size_t>(chunk * slots[k] + slot_of[k][static_cast<std::size_t>(chunk)][static_cast<std::size_t>(mb)])];
      done_at = std::max(done_at, std::max(at, progresses_at(L.rank_of(to), c)) + copy);
      arrives[msg] = {at, copy};
    } else {
      arrives[msg] = {c + whole, 0};
    }
  };
  // Ranks move in time order, one action at a time (a rank waiting in a
  // receive whose message is not yet posted stands aside), so that when a
  // message is posted at c every other rank's history up to c is known.
  for (;;) {
    int k = -1;
    for (int j = 0; j < p; ++j) {
      const auto J = static_cast<std::size_t>(j);
      if (done[J]) continue;
      if (pc[J] < s.ranks[J].size()) {
        const Action& a = s.ranks[J][pc[J]];
        if ((a.op == Op::recv_act || a.op == Op::recv_grad) &&
            !arrives.count({a.stage, a.op == Op::recv_act ? 0 : 1, a.mb}))
          continue;
      }
      if (k < 0 || clock[J] < clock[static_cast<std::size_t>(k)]) k = j;
    }
    if (k < 0) break;
    const auto K = static_cast<std::size_t>(k);
    auto& c = clock[K];
    if (pc[K] == s.ranks[K].size()) {  // the step's end: every send completed
      for (double t : sent[K]) wait_until(K, t);
      done[K] = true;
      continue;
    }
    const Action& a = s.ranks[K][pc[K]++];
    const int ch = L.chunk_of(a.stage);
    const auto CH = static_cast<std::size_t>(ch);
    double dur = 0;
    switch (a.op) {
      case Op::recv_act:
      case Op::recv_grad: wait_until(K, received_at(K, arrives.at({a.stage, a.op == Op::recv_act ? 0 : 1, a.mb}))); break;
      case Op::send_act: post(K, ch, a.mb, {a.stage + 1, 0, a.mb}, a.stage, a.stage + 1, c); break;
      case Op::send_grad: post(K, ch, a.mb, {a.stage - 1, 1, a.mb}, a.stage - 1, a.stage - 1, c); break;
      case Op::forward: {
        auto& fs = free_slots[K][CH];
        if (fs.empty()) {  // more in flight than slots: not a table validate() accepts
          r.deadlock = true;
          r.where = cat("rank ", k, " has no free slot for ", action_str(a));
          return r;
        }
        // The longest-free slot whose sends completed, else the longest-free one, after its sends.
        auto sent_of = [&](int slot) -> double& { return sent[K][static_cast<std::size_t>(ch * slots[K] + slot)]; };
        std::size_t pick = 0;
        while (pick < fs.size() && sent_of(fs[pick]) > c) ++pick;
        if (pick == fs.size()) pick = 0;
        wait_until(K, sent_of(fs[pick]));  // the executor's finish_sends
        sent_of(fs[pick]) = 0;
        slot_of[K][CH][static_cast<std::size_t>(a.mb)] = fs[pick];
        fs.erase(fs.begin() + static_cast<std::ptrdiff_t>(pick));
        dur = costs.of(a.stage).f;
        break;
      }
      case Op::backward: dur = costs.of(a.stage).b(); break;
      case Op::backward_input: dur = costs.of(a.stage).i; break;
      case Op::backward_weight: dur = costs.of(a.stage).w; break;
      case Op::load_micro_batch: break;
    }
    if (is_compute(a.op)) {
      r.started[K].push_back({c, a});
      if (dur > 0) computing[K].push_back({c, c + dur});
      auto& l = live[K];
      if (a.op == Op::forward) r.peak[K] = std::max(r.peak[K], ++l);
      if (a.op == Op::backward || a.op == Op::backward_weight) {
        --l;
        free_slots[K][CH].push_back(slot_of[K][CH][static_cast<std::size_t>(a.mb)]);
      }
    }
    c += dur;
    r.busy[K] += dur;
  }
  for (int k = 0; k < p; ++k) {
    const auto K = static_cast<std::size_t>(k);
    if (done[K]) continue;
    r.deadlock = true;
    r.where += cat(r.where.empty() ? "" : "; ", "rank ", k, " waits in ", action_str(s.ranks[K][pc[K]]));
  }
  if (r.deadlock) return r;
  r.makespan = clock.empty() ? 0 : *std::max_element(clock.begin(), clock.end());
  return r;
}

}  // namespace ringtrain

namespace ringtrain {

SimCosts chunk_costs(const std::vector<int>& counts, const std::vector<double>& layer_costs,
                     const std::vector<double>& layer_out_bytes, const LinkCost& link) {
  SimCosts c;
  c.link = link;
  std::size_t l = 0;
  for (int k : counts) {
    double t = 0;
    for (int j = 0; j < k; ++j) t += layer_costs.at(l++);
    c.stage.push_back({t / 3, t / 3, t / 3});  // a backward costs about two forwards
    c.boundary_bytes.push_back(l - 1 < layer_out_bytes.size() ? layer_out_bytes[l - 1] : 0.0);
  }
  return c;
}

namespace {
// The cuts of n layers into c non-empty chunks, C(n - 1, c - 1), or cap + 1 if more.
long count_cuts(int n, int c, long cap) {
  long r = 1;
  for (int i = 1; i < c; ++i) {
    r = r * (n - i) / i;  // C(n - 1, i) from C(n - 1, i - 1)
    if (r > cap) return cap + 1;
  }
  return r;
}
}  // namespace

std::vector<int> balance_by_play(const std::vector<double>& layer_costs, const Schedule& table, long every_cut) {
  const int chunks = table.layout.stages(), n = static_cast<int>(layer_costs.size());
  std::vector<int> best = balance_by_cost(layer_costs, chunks);
  if (table.layout.chunks == 1) return best;
  const Schedule lowered = lower(table);
  auto play = [&](const std::vector<int>& cut) {
    const SimResult r = simulate(lowered, chunk_costs(cut, layer_costs));
    return r.deadlock ? std::numeric_limits<double>::infinity() : r.makespan;
  };
  double best_s = play(best);
  auto consider = [&](const std::vector<int>& cut) {
    const double t = play(cut);
    if (t >= best_s * (1 - 1e-9)) return false;
    best_s = t, best = cut;
    return true;
  };
  if (count_cuts(n, chunks, every_cut) <= every_cut) {
    std::vector<int> cut(static_cast<std::size_t>(chunks));
    std::function<void(int, int)> each = [&](int k, int left) {  // chunks k.. share `left` layers
      const auto K = static_cast<std::size_t>(k);
      if (k == chunks - 1) {
        cut[K] = left;
        consider(cut);
        return;
      }
      for (cut[K] = 1; cut[K] <= left - (chunks - 1 - k); ++cut[K]) each(k + 1, left - cut[K]);
    };
    each(0, n);
    return best;
  }
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t b = 0; b + 1 < best.size(); ++b)
      for (int d : {-1, 1}) {  // the boundary after chunk b, one layer either way
        std::vector<int> t = best;
        t[b] += d, t[b + 1] -= d;
        if (t[b] >= 1 && t[b + 1] >= 1 && consider(t)) moved = true;
      }
  }
  return best;
}

std::vector<SchedulePrediction> predict_schedules(const PlanInput& in) {
  const int p = in.ranks, m = in.micro_batches, v = in.virtual_stages;
  const bool unit = in.layer_costs.empty();
  const int n = static_cast<int>(in.layer_costs.size());
  std::vector<SchedulePrediction> out;
  double base_peak = -1;
  for (ScheduleKind k : in.kinds) {
    SchedulePrediction x;
    x.kind = k;
    const PipelineLayout L = layout_for(k, p, v);
    x.chunks = L.chunks;
    if (!unit && L.stages() > n) x.skipped = cat(L.stages(), " chunks, the model has ", n, " layers");
    if (k == ScheduleKind::interleaved && m % p != 0) x.skipped = cat("m = ", m, " is not a multiple of p = ", p);
    if (!x.skipped.empty()) {
      out.push_back(x);
      continue;
    }
    const Schedule table = make_schedule(k, p, m, v);
    SimCosts c;
    if (unit) {  // every chunk 1/chunks of a stage, F = I = W
      const double u = 1.0 / L.chunks;
      c.stage.assign(static_cast<std::size_t>(L.stages()), StageCost{u, u, u});
      c.link = in.link;
    } else {  // the cut the run makes (parts.cpp)
      const std::vector<int> cut = in.uniform_cut ? balance_uniform(n, L.stages())
                                                  : balance_by_play(in.layer_costs, table);
      c = chunk_costs(cut, in.layer_costs, in.layer_out_bytes, in.link);
    }
    c.eager_bytes = in.eager_bytes;
    const SimResult r = simulate(table, c);
    RT_CHECK(!r.deadlock, "schedule ", schedule_name(k), " deadlocks in the simulator: ", r.where);
    x.step = r.makespan;
    x.bubble = r.mean_bubble();
    x.busiest = busiest_rank_s(table, c);
    for (int a : r.peak) x.peak = std::max(x.peak, double(a) / L.chunks);
    if (k == ScheduleKind::one_f_one_b) base_peak = x.peak;
    x.fits = base_peak < 0 || x.peak <= base_peak + 1e-9;
    out.push_back(x);
  }
  return out;
}

ScheduleKind pick_schedule(const PlanInput& in, std::string* why) {
  PlanInput q = in;
  q.kinds = {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1, ScheduleKind::interleaved, ScheduleKind::zb_v};
  if (q.virtual_stages < 2) q.kinds.erase(q.kinds.begin() + 2);
  ScheduleKind best = ScheduleKind::one_f_one_b;
  double best_step = 0;
  for (const SchedulePrediction& x : predict_schedules(q)) {
    if (why) {
      char ms[64];
      std::snprintf(ms, sizeof ms, "%.1f ms (busiest rank %.1f)", 1e3 * x.step, 1e3 * x.busiest);
      *why += cat(why->empty() ? "" : "; ", schedule_name(x.kind), " ",
                  !x.skipped.empty() ? cat("left out: ", x.skipped)
                                     : cat(ms, x.fits ? "" : " (more activations than 1f1b)"));
    }
    if (!x.skipped.empty()) continue;
    if (x.kind == ScheduleKind::one_f_one_b) best_step = x.step;
    else if (x.fits && x.step < best_step * (1 - 1e-9)) best = x.kind, best_step = x.step;
  }
  return best;
}

}  // namespace ringtrain
