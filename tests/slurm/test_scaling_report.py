#!/usr/bin/python3
"""CTest jobs/scaling_report: the report's first lines (efficiency, overlap, time split, knee) on a
fixed scaling.csv (tests/slurm/data/scaling_fixed.csv) against numbers computed by hand below."""
import csv
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "jobs"))
import costmodel as cm  # noqa: E402
import scaling_report as sr  # noqa: E402
import scaling_text as st  # noqa: E402

FIXED = os.path.join(ROOT, "tests", "slurm", "data", "scaling_fixed.csv")


def load():
    rows = []
    for r in csv.DictReader(open(FIXED)):
        rows.append({k: (v if k in ("where", "mode", "model") else float(v)) for k, v in r.items()})
        rows[-1]["ranks"] = int(rows[-1]["ranks"])
    return rows


class Points(unittest.TestCase):
    def setUp(self):
        self.p = {(r["where"], r["mode"], r["ranks"]): r for r in st.point_rows(load())}

    def test_efficiency_against_one_rank_of_the_same_mode(self):
        # weak 2 ranks: 1600 / (2 x 1000) = 0.8; strong 4: 2200 / (4 x 1100) = 0.5;
        # hosts weak 4 against local weak 1: 2400 / (4 x 1000) = 0.6.
        self.assertAlmostEqual(self.p[("local", "weak", 2)]["efficiency"], 0.8, places=12)
        self.assertAlmostEqual(self.p[("local", "strong", 4)]["efficiency"], 0.5, places=12)
        self.assertAlmostEqual(self.p[("hosts-tbf", "weak", 4)]["efficiency"], 0.6, places=12)
        self.assertAlmostEqual(self.p[("local", "weak", 1)]["efficiency"], 1.0, places=12)

    def test_split_of_the_step(self):
        w2 = self.p[("local", "weak", 2)]  # 80 ms: 64 compute, 8 exposed, 4 data wait, 4 other
        self.assertAlmostEqual(w2["compute"], 0.8, places=12)
        self.assertAlmostEqual(w2["exposed"], 0.1, places=12)
        self.assertAlmostEqual(w2["data_wait"], 0.05, places=12)
        self.assertAlmostEqual(w2["other"], 0.05, places=12)

    def test_hidden_share_of_communication(self):
        # 1 - exposed / all-reduce: 1 - 8/20 = 0.6; 1 - 16/16 = 0; 1 - 32/40 = 0.2; none at 1 rank.
        self.assertAlmostEqual(self.p[("local", "weak", 2)]["hidden"], 0.6, places=12)
        self.assertAlmostEqual(self.p[("local", "strong", 4)]["hidden"], 0.0, places=12)
        self.assertAlmostEqual(self.p[("hosts-tbf", "weak", 4)]["hidden"], 0.2, places=12)
        self.assertIsNone(self.p[("local", "weak", 1)]["hidden"])

    def test_summary_lines_come_first_and_show_the_numbers(self):
        user = {"desc": "cnn, 1024 ranks", "curve": [(4, 0.95), (8, 0.85), (16, 0.7)], "knee": 16}
        lines = st.summary_lines(st.point_rows(load()), user)
        self.assertTrue(lines[0].startswith("0. Summary"))
        row = next(l for l in lines if " weak " in l and l.split()[:4] == ["local", "weak", "cnn", "2"])
        self.assertIn(" 80% ", row)
        self.assertIn(" 60% ", row)                     # hidden
        self.assertIn("80% / 10% / 5% / 5%", row)       # the split
        self.assertIn("knee (efficiency < 80%): 16 ranks", lines[-2])


class Knee(unittest.TestCase):
    def test_first_rank_count_below_the_threshold(self):
        # eff = 1 / (1 + p / 1000) < 0.8  <=>  p > 250: the first power of two is 256.
        ranks = [2 ** k for k in range(2, 14)]
        self.assertEqual(cm.knee(lambda p: 1 / (1 + p / 1000), ranks), 256)
        self.assertIsNone(cm.knee(lambda p: 0.9, ranks))

    def test_user_cluster_layout(self):
        c = cm.cluster_of(1024, 4, 25.0, 15.0, {"alpha": 1e-6, "beta": 1e-10}, 0.0)
        self.assertEqual((c.m, c.q), (256, 4))
        self.assertAlmostEqual(c.net["alpha"], 15e-6)
        self.assertAlmostEqual(c.net["beta"], 8 / 25e9)


class TcRate(unittest.TestCase):
    def test_rates_the_study_writes(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "rate.txt")
            for text, gbit in (("2gbit\n", 2.0), ("100mbit", 0.1), ("500kbit", 5e-4)):
                open(f, "w").write(text)
                self.assertAlmostEqual(sr.tc_gbit(f), gbit, places=12)
            self.assertIsNone(sr.tc_gbit(os.path.join(d, "absent.txt")))
            open(f, "w").write("fast")
            with self.assertRaises(SystemExit) as e:
                sr.tc_gbit(f)
            self.assertIn("'fast' is not a tc rate", str(e.exception))


if __name__ == "__main__":
    unittest.main()
