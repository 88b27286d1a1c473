// Schedules as tables: lowering, validation, printing and reading (schedule.hpp).
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/schedule.hpp"
#include "ringtrain/parallel/simulator.hpp"

namespace ringtrain {
namespace {

char compute_letter(Op op) {
  switch (op) {
    case Op::forward: return 'F';
    case Op::backward: return 'B';
    case Op::backward_input: return 'I';
    case Op::backward_weight: return 'W';
    default: return 0;
  }
}

bool is_backward(Op op) { return op == Op::backward || op == Op::backward_input; }

}  // namespace

const char* op_name(Op op) {
  static const char* n[] = {"Forward", "Backward", "BackwardInput", "BackwardWeight", "LoadMicroBatch",
                            "SendAct", "RecvAct",  "SendGrad",      "RecvGrad"};
  return n[static_cast<int>(op)];
}

bool is_compute(Op op) { return compute_letter(op) != 0; }

std::string action_str(const Action& a) {
  if (const char c = compute_letter(a.op)) return cat(a.stage, c, a.mb);
  return cat(op_name(a.op), "(", a.stage, ",", a.mb, ")");
}

Schedule lower(const Schedule& in) {
  Schedule out = in;
  const PipelineLayout& L = in.layout;
  const int S = L.stages();
  for (std::size_t r = 0; r < in.ranks.size(); ++r) {
    auto& list = out.ranks[r];
    list.clear();
    for (const Action& a : in.ranks[r]) {
      if (!is_compute(a.op)) continue;  // lowering again starts from the compute actions
      const int g = a.stage, me = static_cast<int>(r);
      const bool remote_prev = g > 0 && L.rank_of(g - 1) != me, remote_next = g + 1 < S && L.rank_of(g + 1) != me;
      if (a.op == Op::forward) {
        if (g == 0) list.push_back({Op::load_micro_batch, g, a.mb});
        if (remote_prev) list.push_back({Op::recv_act, g, a.mb});
        list.push_back(a);
        if (remote_next) list.push_back({Op::send_act, g, a.mb});
      } else if (is_backward(a.op)) {
        if (remote_next) list.push_back({Op::recv_grad, g, a.mb});
        list.push_back(a);
        if (remote_prev) list.push_back({Op::send_grad, g, a.mb});
      } else {
        list.push_back(a);
      }
    }
  }
  return out;
}

void validate(const Schedule& s) {
  const PipelineLayout& L = s.layout;
  const int p = L.ranks, S = L.stages(), m = s.micro_batches;
  RT_CHECK(p >= 1 && L.chunks >= 1 && m >= 1, "pipeline schedule: ", p, " ranks, ", L.chunks, " chunks per rank, ",
           m, " micro-batches");
  RT_CHECK(static_cast<int>(s.ranks.size()) == p, "pipeline schedule: lists for ", s.ranks.size(),
           " ranks, the pipeline has ", p);
  // (stage, mb) -> what has run, per kind
  std::vector<std::vector<int>> f(S, std::vector<int>(m, 0)), b(S, std::vector<int>(m, 0)),
      i(S, std::vector<int>(m, 0)), w(S, std::vector<int>(m, 0));
  for (int r = 0; r < p; ++r) {
    for (const Action& a : s.ranks[static_cast<std::size_t>(r)]) {
      const std::string where = cat("pipeline schedule: rank ", r, ", action ", action_str(a), ": ");
      RT_CHECK(a.stage >= 0 && a.stage < S, where, "stage ", a.stage, " is not in [0, ", S, ")");
      RT_CHECK(a.mb >= 0 && a.mb < m, where, "micro-batch ", a.mb, " is not in [0, ", m, ")");
      RT_CHECK(L.rank_of(a.stage) == r, where, "stage ", a.stage, " is held by rank ", L.rank_of(a.stage));
      if (!is_compute(a.op)) continue;
      const int g = a.stage, k = a.mb;
      const bool local_prev = g > 0 && L.rank_of(g - 1) == r, local_next = g + 1 < S && L.rank_of(g + 1) == r;
      switch (a.op) {
        case Op::forward:
          RT_CHECK(f[g][k]++ == 0, where, "forwards micro-batch ", k, " of stage ", g, " twice");
          RT_CHECK(!local_prev || f[g - 1][k], where, "runs before ", g - 1, "F", k, " on the same rank");
          break;
        case Op::backward:
        case Op::backward_input:
          RT_CHECK(f[g][k], where, "comes before its forward");
          RT_CHECK(b[g][k] + i[g][k] == 0, where, "backwards micro-batch ", k, " of stage ", g, " twice");
          RT_CHECK(!local_next || b[g + 1][k] || i[g + 1][k], where, "runs before the backward of stage ", g + 1,
                   " on the same rank");
          (a.op == Op::backward ? b : i)[g][k] = 1;
          break;
        case Op::backward_weight:
          RT_CHECK(i[g][k], where, "comes before its input gradient ", g, "I", k);
          RT_CHECK(w[g][k]++ == 0, where, "runs twice");
          break;
        default: break;
      }
    }
  }
  for (int g = 0; g < S; ++g)
    for (int k = 0; k < m; ++k) {
      const std::string what = cat("pipeline schedule: rank ", L.rank_of(g), " never runs ");
      RT_CHECK(f[g][k], what, g, "F", k);
      RT_CHECK(b[g][k] || i[g][k], what, "a backward of stage ", g, " micro-batch ", k, " (", g, "B", k, " or ", g,
               "I", k, ")");
      RT_CHECK(!i[g][k] || w[g][k], what, g, "W", k, " after ", g, "I", k);
    }
  const SimResult r = simulate(s);
  RT_CHECK(!r.deadlock, "pipeline schedule: deadlock: ", r.where);
}

std::vector<int> peak_in_flight(const Schedule& s) {
  std::vector<int> out;
  for (const auto& list : s.ranks) {
    int live = 0, peak = 0;
    for (const Action& a : list) {
      if (a.op == Op::forward) peak = std::max(peak, ++live);
      if (a.op == Op::backward || a.op == Op::backward_weight) --live;
    }
    out.push_back(peak);
  }
  return out;
}

std::vector<std::vector<int>> peak_in_flight_per_chunk(const Schedule& s) {
  std::vector<std::vector<int>> out;
  for (const auto& list : s.ranks) {
    std::vector<int> live(static_cast<std::size_t>(s.layout.chunks), 0), peak = live;
    for (const Action& a : list) {
      const auto c = static_cast<std::size_t>(s.layout.chunk_of(a.stage));
      if (a.op == Op::forward) peak[c] = std::max(peak[c], ++live[c]);
      if (a.op == Op::backward || a.op == Op::backward_weight) --live[c];
    }
    out.push_back(peak);
  }
  return out;
}

std::string schedule_table(const Schedule& s) {
  const SimResult r = simulate(s);
  if (r.deadlock) return cat("(deadlock: ", r.where, ")\n");
  const int steps = static_cast<int>(r.makespan + 0.5);
  std::size_t width = 1;
  for (const auto& row : r.started)
    for (const auto& [t, a] : row) width = std::max(width, action_str(a).size());
  std::ostringstream os;
  for (std::size_t k = 0; k < r.started.size(); ++k) {
    std::vector<std::string> cells(static_cast<std::size_t>(std::max(steps, 0)), ".");
    for (const auto& [t, a] : r.started[k]) {
      // Unit play: a B spans two slots (I + W), the first shows it.
      const auto at = static_cast<std::size_t>(t + 0.5);
      if (at < cells.size()) cells[at] = action_str(a);
      if (a.op == Op::backward && at + 1 < cells.size()) cells[at + 1] = "";
    }
    os << "rank " << k << " |";
    for (const std::string& c : cells) {
      os << ' ' << c << std::string(width - c.size(), ' ');  // "" : the second unit of a B
    }
    os << '\n';
  }
  return os.str();
}

std::string schedule_csv(const Schedule& s) {
  std::ostringstream os;
  os << "# pipeline schedule: " << s.layout.ranks << " ranks, " << s.layout.chunks << " chunks per rank ("
     << (s.layout.placement == ChunkPlacement::v ? "v" : "loop") << "), " << s.micro_batches
     << " micro-batches; one line per rank; cells STAGE{F|B|I|W}MICROBATCH\n";
  for (const auto& list : s.ranks) {
    bool first = true;
    for (const Action& a : list) {
      if (!is_compute(a.op)) continue;
      os << (first ? "" : ",") << action_str(a);
      first = false;
    }
    os << '\n';
  }
  return os.str();
}

Schedule read_schedule_csv(const std::string& path, int p) {
  std::ifstream in(path);
  RT_CHECK(in.good(), "parallel.schedule = ", path, ": cannot open the file");
  std::vector<std::vector<Action>> rows;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const auto start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') continue;
    std::vector<Action> row;
    std::string cell;
    std::istringstream ls(line);
    int col = 0;
    while (std::getline(ls, cell, ',')) {
      std::istringstream cs(cell);
      std::string tok;
      while (cs >> tok) {
        ++col;
        const std::string where = cat(path, ":", lineno, ": cell ", col, " '", tok, "'");
        const auto pos = tok.find_first_of("FBIW");
        RT_CHECK(pos != std::string::npos && pos > 0 && pos + 1 < tok.size(), where,
                 " is not an action STAGE{F|B|I|W}MICROBATCH such as 0F3");
        Action a;
        a.op = tok[pos] == 'F' ? Op::forward : tok[pos] == 'B' ? Op::backward : tok[pos] == 'I' ? Op::backward_input
                                                                                                 : Op::backward_weight;
        try {
          std::size_t used = 0;
          a.stage = std::stoi(tok.substr(0, pos), &used);
          RT_CHECK(used == pos, "");
          a.mb = std::stoi(tok.substr(pos + 1), &used);
          RT_CHECK(used == tok.size() - pos - 1, "");
        } catch (const std::exception&) {
          RT_FAIL(where, " is not an action STAGE{F|B|I|W}MICROBATCH such as 0F3");
        }
        row.push_back(a);
      }
    }
    rows.push_back(std::move(row));
  }
  RT_CHECK(static_cast<int>(rows.size()) == p, "parallel.schedule = ", path, ": ", rows.size(),
           " rank lines, the pipeline has parallel.pipeline = ", p);
  int top = 0, m = 0;
  for (const auto& row : rows)
    for (const Action& a : row) top = std::max(top, a.stage), m = std::max(m, a.mb + 1);
  RT_CHECK((top + 1) % p == 0, "parallel.schedule = ", path, ": stages 0..", top, " are not a multiple of ", p,
           " ranks");
  Schedule s;
  s.micro_batches = m;
  s.ranks = std::move(rows);
  // The layout is where the stages are: loop, else v; validate() names any stage on the wrong rank.
  s.layout = {p, (top + 1) / p, ChunkPlacement::loop};
  for (int r = 0; r < p; ++r)
    for (const Action& a : s.ranks[static_cast<std::size_t>(r)])
      if (s.layout.rank_of(a.stage) != r) s.layout.placement = ChunkPlacement::v;
  try {
    validate(s);
  } catch (const Error& e) {
    RT_FAIL("parallel.schedule = ", path, ": ", e.what());
  }
  return s;
}

double analytic_bubble(ScheduleKind kind, int p, int m, double tf, double tb, double tw, int v) {
  switch (kind) {
    case ScheduleKind::zb_h1: {
      const double idle = (p - 1) * std::max(0.0, tf + tb - tw);
      return idle / (m * (tf + tb + tw) + idle);
    }
    case ScheduleKind::interleaved: return double(p - 1) / double(v * m + p - 1);
    case ScheduleKind::zb_v: {
      SimCosts c;
      c.stage.assign(static_cast<std::size_t>(2 * p), StageCost{tf / 2, tb / 2, tw / 2});
      return simulate(make_schedule(ScheduleKind::zb_v, p, m), c).mean_bubble();
    }
    default: return double(p - 1) / double(m + p - 1);
  }
}

}  // namespace ringtrain
