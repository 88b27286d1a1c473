#!/usr/bin/python3
"""CTest jobs/costmodel_failures: the cost model's failure, restart and checkpoint terms
(jobs/costmodel.py, issue 46) against independent references: the optima found numerically, a
Monte-Carlo simulation of the continuous process Daly's formula describes, and a step-level
simulation of what bench/train_injected_failures.sh runs (failures after an exponential number of
executed steps, a snapshot every k steps complete by the end of the next step). Seconds."""
import math
import os
import random
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "jobs"))
import costmodel as cm  # noqa: E402

CASES = [(1.0, 1000.0), (10.0, 1000.0), (0.2, 200.0), (5.0, 50.0)]  # (save cost, MTTF)


def argmin(f, lo, hi, iters=200):
    """Golden-section search of a unimodal f on [lo, hi]."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    for _ in range(iters):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(c) < f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def simulate_segments(interval, save, mttf, restart, segments, rng):
    """Mean time per segment: interval + save retried until no exponential failure hits it."""
    total = 0.0
    for _ in range(segments):
        while True:
            x = rng.expovariate(1.0 / mttf)
            if x >= interval + save:
                total += interval + save
                break
            total += x + restart
    return total / segments


def simulate_steps(n, mttf, every, rng):
    """The benchmark's process, step by step. Returns executed steps, failures, lost steps each."""
    done = complete = executed = since = 0
    pending, lost = None, []
    draw = lambda: max(1, round(rng.expovariate(1.0 / mttf)))  # noqa: E731 (as injected_failures.py)
    gap = draw()
    while done < n:
        done += 1
        executed += 1
        since += 1
        if pending is not None and pending < done:  # the step after a snapshot waits for it
            complete, pending = pending, None
        if done % every == 0:
            pending = done
        if since >= gap and done < n:  # a failure right after this step's line
            lost.append(done - complete)
            done, pending, since, gap = complete, None, 0, draw()
    return executed, len(lost), lost


class Intervals(unittest.TestCase):
    def test_young_is_where_the_first_order_waste_has_zero_derivative(self):
        for save, mttf in CASES:
            tau = cm.young_interval(save, mttf)
            f = lambda x: cm.waste_first_order(x, save, mttf, restart=3.0)  # noqa: E731
            h = tau * 1e-4
            d1 = (f(tau + h) - f(tau - h)) / (2 * h)
            d2 = (f(tau + h) - 2 * f(tau) + f(tau - h)) / h ** 2
            # The slope's scale: either term's derivative alone, save / tau^2.
            self.assertLess(abs(d1), 1e-6 * save / tau ** 2, (save, mttf, d1))
            self.assertGreater(d2, 0)
            self.assertAlmostEqual(argmin(f, tau / 10, tau * 10), tau, delta=tau * 1e-6)

    def test_daly_interval_minimises_the_exact_wall_time(self):
        for save, mttf in CASES:
            exact = argmin(lambda x: cm.daly_wall(1.0, x, save, mttf, 2.0), 1e-3, 10 * mttf)
            # Measured: within 0.05% of the numerical optimum at save/MTTF <= 0.1; bound 10x.
            self.assertAlmostEqual(cm.daly_interval(save, mttf), exact, delta=exact * 5e-3, msg=(save, mttf))
            # Young's first-order interval is the limit: within sqrt(save / 2 MTTF) / 3 of it, and above.
            y = cm.young_interval(save, mttf)
            self.assertGreater(y, exact)
            self.assertLess(y / exact - 1, math.sqrt(save / (2 * mttf)) / 3 + save / exact + 1e-3)

    def test_daly_interval_is_the_mttf_when_a_save_costs_twice_it(self):
        self.assertEqual(cm.daly_interval(300.0, 100.0), 100.0)


class WallTime(unittest.TestCase):
    def test_daly_wall_against_a_simulation_of_the_process(self):
        rng = random.Random(46)
        for tau, save, mttf, restart in [(10.0, 1.0, 100.0, 5.0), (30.0, 2.0, 50.0, 3.0)]:
            sim = simulate_segments(tau, save, mttf, restart, 100000, rng)
            # Measured: 0.2% apart with 100,000 segments; bound 10x.
            self.assertAlmostEqual(cm.daly_wall(tau, tau, save, mttf, restart), sim, delta=sim * 0.02)

    def test_run_with_failures_against_the_step_simulation(self):
        rng = random.Random(7)
        for n, mttf, every, restart, save in [(20000, 50, 1, 6.0, 0.3), (20000, 200, 5, 6.0, 1.0),
                                              (20000, 200, 13, 6.0, 2.0), (40000, 1000, 30, 6.0, 3.0)]:
            runs = [simulate_steps(n, mttf, every, rng) for _ in range(8)]
            ex = sum(r[0] for r in runs) / len(runs)
            fails = sum(r[1] for r in runs) / len(runs)
            sim = n / (ex + ex / every * save + fails * restart)  # step time 1
            model = cm.run_with_failures(n, 1.0, mttf, restart, every, save)
            # Measured: ratios 0.3% apart at most; bound 10x.
            self.assertAlmostEqual(model["ratio"], sim, delta=sim * 0.03, msg=(mttf, every))
            lost = [x for r in runs for x in r[2]]
            self.assertLessEqual(max(lost), every)  # the strict bound: never more than k steps
            # The mean loss, (k + 1) / 2, within 3 standard errors of a uniform phase (k / sqrt(12) each).
            self.assertAlmostEqual(sum(lost) / len(lost), cm.lost_steps(every),
                                   delta=3 * every / math.sqrt(12 * len(lost)), msg=every)

    def test_given_failures_is_the_closed_form(self):
        m = cm.run_with_failures(1000, 0.03, 200, 5.5, 4, 0.02, failures=3)
        executed = 1000 + 3 * 2.5
        self.assertAlmostEqual(m["wall_s"], executed * 0.03 + executed / 4 * 0.02 + 3 * 5.5, places=12)
        self.assertAlmostEqual(m["ratio"], 30.0 / m["wall_s"], places=12)

    def test_no_failures_costs_only_the_saves(self):
        m = cm.run_with_failures(1000, 1.0, float("inf"), 100.0, 10, 0.5)
        self.assertEqual(m["failures"], 0.0)
        self.assertAlmostEqual(m["ratio"], 1000 / 1050, places=12)


if __name__ == "__main__":
    unittest.main(verbosity=2)
