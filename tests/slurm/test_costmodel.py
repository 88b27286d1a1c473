#!/usr/bin/python3
"""CTest jobs/costmodel: the cost model's formulas against hand-computed values, the fit against
known parameters, and the predictor's choices and input errors."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "jobs"))
import costmodel as cm  # noqa: E402

SHM = {"alpha": 2e-6, "beta": 1 / 10e9}
NET = {"alpha": 20e-6, "beta": 1 / 1e9}


class Formulas(unittest.TestCase):
    def test_ring_one_node(self):
        c = cm.Cluster(1, 4, SHM, NET, 1 / 5e9)
        n = 1 << 20
        want = 2 * 3 * (2e-6 + n / 4 / 10e9) + 3 / 4 * n / 5e9
        self.assertAlmostEqual(cm.t_ring(n, c), want, delta=want * 1e-12)

    def test_ring_across_nodes_uses_network(self):
        c = cm.Cluster(4, 1, SHM, NET, 0.0)
        n = 4096
        self.assertAlmostEqual(cm.t_ring(n, c), 6 * (20e-6 + n / 4 / 1e9), delta=1e-15)

    def test_tree_power_of_two_and_fold(self):
        c8 = cm.Cluster(8, 1, SHM, NET, 0.0)
        self.assertAlmostEqual(cm.t_tree(1000, c8), 3 * (20e-6 + 1000 / 1e9), delta=1e-15)
        c6 = cm.Cluster(6, 1, SHM, NET, 0.0)  # 4 + 2 folded: lg 4 exchanges + 2 fold steps
        self.assertAlmostEqual(cm.t_tree(1000, c6), 4 * (20e-6 + 1000 / 1e9), delta=1e-15)

    def test_tree_nic_shared_by_ranks_of_a_node(self):
        c = cm.Cluster(2, 4, SHM, NET, 0.0)  # masks 1, 2 inside the node, 4 across with 4 flows
        n = 1000
        want = 2 * (2e-6 + n / 10e9) + (20e-6 + 4 * n / 1e9)
        self.assertAlmostEqual(cm.t_tree(n, c), want, delta=1e-15)

    def test_hosts_sharing_cores_pay_their_share(self):
        # 4 emulated hosts on 2 cores: each rank gets half a core, so latency and reduction cost 2x;
        # the veth flows (4 on 2 cores) cost 2x the fitted β, above a tbf wire of 1/(0.5 GB/s).
        c = cm.Cluster(4, 1, SHM, NET, 1 / 5e9, cores=2, beta_link=1 / 0.5e9)
        n = 4096
        want = 6 * (20e-6 * 2 + n / 4 / 0.5e9) + 3 / 4 * n / 5e9 * 2
        self.assertAlmostEqual(cm.t_ring(n, c), want, delta=want * 1e-12)
        self.assertEqual(cm.Cluster(2, 1, SHM, NET, 0.0, cores=2).share, 1.0)
        self.assertEqual(cm.Cluster(4, 1, SHM, NET, 0.0).share, 1.0)  # a real cluster: own cores

    def test_one_rank_costs_nothing(self):
        c = cm.Cluster(1, 1, SHM, NET, 1e-9)
        self.assertEqual(cm.t_ring(1 << 20, c), 0.0)
        self.assertEqual(cm.t_tree(1 << 20, c), 0.0)

    def test_choice_small_vs_large(self):
        c = cm.Cluster(64, 1, SHM, NET, 0.0)
        self.assertEqual(cm.best_allreduce(64, c, ("ring", "tree"))[1], "tree")      # latency-bound
        self.assertEqual(cm.best_allreduce(64 << 20, c, ("ring", "tree"))[1], "ring")  # bandwidth-bound

    def test_exposed_communication_and_overlap(self):
        c = cm.Cluster(2, 1, SHM, NET, 0.0)
        work = {"grad_bytes": 8e6, "t_compute": 0.1, "t_other": 0.0, "omega": 0.0, "cycle_s": 0.0}
        t0, d0 = cm.step_time(work, c, 0)
        self.assertAlmostEqual(t0, 0.1 + d0["allreduce_s"], delta=1e-12)
        t1, d1 = cm.step_time(dict(work, omega=0.5), c, 0)  # one bucket: nothing to hide behind
        self.assertAlmostEqual(t1, t0, delta=1e-12)
        t2, d2 = cm.step_time(dict(work, omega=0.5), c, 1 << 20)  # 8 buckets, 7 of them hidden
        self.assertLess(t2, t0)
        self.assertAlmostEqual(d2["exposed_s"], cm.best_allreduce(8e6 - 7 * (1 << 20), c)[0], delta=1e-12)  # the last bucket

    def test_weak_scaling_efficiency_falls_with_ranks(self):
        work = {"grad_bytes": 100e6, "t_compute": 0.05, "t_other": 0.0, "omega": 0.6, "cycle_s": 0.0}
        effs = [cm.efficiency(work, cm.Cluster(m, 4, SHM, NET, 0.0))[0] for m in (2, 16, 128)]
        self.assertTrue(1.0 >= effs[0] >= effs[1] >= effs[2] > 0)


class Fit(unittest.TestCase):
    def test_recovers_known_parameters(self):
        alpha, beta, gamma = 30e-6, 1 / 2e9, 1 / 8e9
        pts = []
        for p in (2,):
            for n in [4 ** k * 1024 for k in range(8)]:
                for algo in ("ring", "tree"):
                    row = cm.design_row(algo, n, p)
                    pts.append((algo, n, p, row[0] * alpha + row[1] * beta + row[2] * gamma))
        link, g = cm.fit_sweep(pts)
        self.assertAlmostEqual(link["alpha"] / alpha, 1, delta=1e-6)
        self.assertAlmostEqual(link["beta"] / beta, 1, delta=1e-6)
        self.assertAlmostEqual(g / gamma, 1, delta=1e-6)
        link2, _ = cm.fit_sweep(pts, gamma)  # gamma given: alpha and beta only
        self.assertAlmostEqual(link2["beta"] / beta, 1, delta=1e-6)

    def test_per_algorithm_fit_predicts_more_ranks(self):
        # Ring at full rate, tree exchanges at half (as Open MPI's TCP transport on a shaped link):
        # fitted on 2 ranks per algorithm, each predicts 4 ranks exactly; one joint fit cannot.
        alpha, beta, gamma = 20e-6, 1 / 1e9, 0.0
        truth = {"ring": (alpha, beta), "tree": (alpha, 2 * beta)}
        def t(algo, n, p):
            a, b = truth[algo]
            row = cm.design_row(algo, n, p)
            return row[0] * a + row[1] * b
        pts = [(algo, n, 2, t(algo, n, 2)) for n in [4 ** k * 1024 for k in range(6)] for algo in truth]
        link = cm.fit_link(pts, gamma)
        self.assertAlmostEqual(link["per_algo"]["tree"]["beta"] / (2 * beta), 1, delta=1e-6)
        c = cm.Cluster(4, 1, SHM, link, gamma)
        for algo in truth:
            self.assertAlmostEqual(cm.t_allreduce(16 << 20, c, algo) / t(algo, 16 << 20, 4), 1, delta=1e-6)
        joint = dict(link)
        joint.pop("per_algo")
        cj = cm.Cluster(4, 1, SHM, joint, gamma)
        self.assertGreater(abs(cm.t_allreduce(16 << 20, cj, "tree") / t("tree", 16 << 20, 4) - 1), 0.1)

    def test_non_negative(self):
        pts = [("ring", n, 2, 1e-3) for n in (1024, 4096, 16384)]  # flat: no bandwidth term
        link, g = cm.fit_sweep(pts)
        self.assertGreaterEqual(link["beta"], 0)
        self.assertGreaterEqual(g, 0)
        self.assertAlmostEqual(link["alpha"] * 2, 1e-3, delta=1e-9)


class Cli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.model = os.path.join(self.dir, "model.json")
        with open(self.model, "w") as f:
            json.dump({"links": {"shm": SHM, "net": NET}, "gamma": 0.0, "cores": 2,
                       "work": {"resnet": {"grad_bytes": 1.1e6, "t_compute": 0.5, "t_other": 0.0, "omega": 0.3,
                                           "cycle_s": 1e-3, "batch": 64, "fusion": 64 << 20}}}, f)

    def run_cli(self, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "costmodel.py"), "--model", self.model, *args],
                              capture_output=True, text=True)

    def test_predicts_table(self):
        r = self.run_cli("--ranks", "8", "1024", "--gbit", "25")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stdout.splitlines() if l.strip().startswith("1024")]
        self.assertEqual(len(lines), 1)
        self.assertIn("256", lines[0].split()[1])

    def test_bad_input(self):
        r = self.run_cli("--ranks", "1022", "--ranks-per-node", "4")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--ranks 1022 is not a multiple of --ranks-per-node 4", r.stderr)
        r = self.run_cli("--net", "vgg")
        self.assertIn("no measured work for network 'vgg'", r.stderr)
        r = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "costmodel.py"), "--model", "/nonexistent.json"],
                           capture_output=True, text=True)
        self.assertIn("cannot read model '/nonexistent.json'", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=1)
