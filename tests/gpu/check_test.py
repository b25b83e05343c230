"""Tests of scripts/gpu/check.py's logic that a GPU run would exercise first: a test binary that
crashes mid-run, gtest's reports, the modes comparison, the crossover and the goals.

    python3 -m unittest tests/gpu/check_test.py
"""

import importlib.util
import json
import os
import stat
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location(
    "check", os.path.join(HERE, "..", "..", "scripts", "gpu", "check.py"))
check = importlib.util.module_from_spec(SPEC)
sys.modules["check"] = check
SPEC.loader.exec_module(check)

# A stand-in for a gtest binary with tests A.one, A.two (crashes: SIGSEGV) and A.three (skips):
# it honours --gtest_filter=-X:Y and writes the JSON report only when it ends normally.
FAKE_GTEST = textwrap.dedent("""\
    #!/usr/bin/env bash
    report=""; excluded=""
    for arg in "$@"; do
      case "$arg" in
        --gtest_output=json:*) report="${arg#--gtest_output=json:}" ;;
        --gtest_filter=-*) excluded=":${arg#--gtest_filter=-}:" ;;
      esac
    done
    run() { [[ "$excluded" != *":A.$1:"* ]]; }
    entries=()
    if run one; then
      echo "[ RUN      ] A.one"; echo "[       OK ] A.one (1 ms)"
      entries+=('{"name":"one","status":"RUN","result":"COMPLETED"}')
    fi
    if run two; then
      echo "[ RUN      ] A.two"; kill -SEGV $$
    fi
    if run three; then
      echo "[ RUN      ] A.three"; echo "x.cc:1: Skipped"; echo "needs two GPUs"
      echo "[  SKIPPED ] A.three (0 ms)"
      entries+=('{"name":"three","status":"RUN","result":"SKIPPED"}')
    fi
    joined=$(IFS=,; echo "${entries[*]}")
    echo "{\\"testsuites\\":[{\\"name\\":\\"A\\",\\"testsuite\\":[$joined]}]}" > "$report"
    """)


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        self.addCleanup(self.work.cleanup)
        self.run_ = check.Run(self.work.name, self.work.name, 60, "cuda")
        self.addCleanup(self.run_.log.close)
        self.run_.kit = self.work.name
        os.makedirs(os.path.join(self.work.name, "bin"))
        binary = os.path.join(self.work.name, "bin", "fake_test")
        with open(binary, "w", encoding="utf-8") as f:
            f.write(FAKE_GTEST)
        os.chmod(binary, os.stat(binary).st_mode | stat.S_IEXEC)
        self.entry = {"kind": "test", "name": "fake_test", "file": "bin/fake_test"}

    def test_a_crash_is_reported_and_the_remaining_tests_still_run(self):
        results = check.run_test_binary(self.run_, self.entry, time.monotonic() + 60)
        by_test = {r["test"]: r for r in results}
        self.assertEqual(by_test["A.one"]["result"], "passed")
        self.assertEqual(by_test["A.two"]["result"], "crashed")
        self.assertIn("exit -11", by_test["A.two"]["message"])
        self.assertEqual(by_test["A.three"]["result"], "skipped")
        self.assertEqual(by_test["A.three"]["message"], "needs two GPUs")
        self.assertEqual(len(results), 3)

    def test_the_tests_step_fails_on_a_crash_and_counts_every_outcome(self):
        self.run_.manifest = {"binaries": [self.entry, {"kind": "tool", "name": "tandem"}]}
        step = check.tests(self.run_, time.monotonic() + 60)
        self.assertEqual(step["status"], "failed")
        self.assertEqual(step["counts"], {"passed": 1, "crashed": 1, "skipped": 1})
        self.assertEqual([f["test"] for f in step["failures"]], ["A.two"])
        self.assertEqual(step["binaries"]["fake_test"]["skip_reasons"], ["needs two GPUs"])

    def test_an_exhausted_time_box_is_a_timeout_not_a_pass(self):
        results = check.run_test_binary(self.run_, self.entry, time.monotonic() + 1)
        self.assertEqual([r["result"] for r in results], ["timeout"])


class ComparisonTest(unittest.TestCase):
    def test_outputs_are_compared_per_variant_with_the_first_divergence(self):
        gpu = {"outputs": [{"variant": "ar", "prompt": 0, "tokens": [1, 2, 3]},
                           {"variant": "ar", "prompt": 1, "tokens": [4, 5, 6]},
                           {"variant": "spec", "prompt": 0, "tokens": [1, 2]}]}
        cpu = {"outputs": [{"variant": "ar", "prompt": 0, "tokens": [1, 2, 3]},
                           {"variant": "ar", "prompt": 1, "tokens": [4, 9, 6]},
                           {"variant": "spec", "prompt": 0, "tokens": [1, 2, 7]}]}
        table = check.compare_outputs(gpu, cpu)
        self.assertEqual(table["ar"], {"prompts": 2, "equal": 1, "first_divergence": [1]})
        self.assertEqual(table["spec"], {"prompts": 1, "equal": 0, "first_divergence": [2]})

    def test_crossover_is_the_first_level_where_ar_reaches_spec(self):
        levels = [{"mode": "ar", "concurrency": 1, "tokens_per_second": 100},
                  {"mode": "spec", "concurrency": 1, "tokens_per_second": 180},
                  {"mode": "ar", "concurrency": 4, "tokens_per_second": 390},
                  {"mode": "spec", "concurrency": 4, "tokens_per_second": 380},
                  {"mode": "auto", "concurrency": 4, "tokens_per_second": 385}]
        self.assertEqual(check.crossover(levels)["concurrency"], 4)
        self.assertIsNone(check.crossover(levels[:2])["concurrency"])

    def test_goals_compare_with_the_right_direction(self):
        summary = {"steps": {
            "engine": {"result": {"decode": {"bandwidth_efficiency": 0.9,
                                             "tokens_per_second": 150.0},
                                  "grid": {"verify_cost": {"512": {"16": 1.3}}}}},
            "torch": {"result": {"tokens_per_second": 160.0}},
            "cluster": {"serve": {"auto_vs_best": [
                {"concurrency": 1, "ratio": 0.9, "paired_ratio_median": 0.97}]}}}}
        goals = check.goals(summary)
        self.assertTrue(goals["bandwidth_efficiency"]["met"])
        self.assertFalse(goals["verify_cost_16_over_1"]["met"])
        self.assertAlmostEqual(goals["tokens_per_second_over_torch"]["value"], 150 / 160)
        self.assertFalse(goals["tokens_per_second_over_torch"]["met"])
        self.assertTrue(goals["auto_over_best_c1"]["met"])
        json.dumps(goals)  # the summary must stay JSON


if __name__ == "__main__":
    unittest.main()
