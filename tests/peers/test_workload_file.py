#!/usr/bin/env python3
"""peers.py's workload files: what they make, and bad input refused with the file, the document
and the field named. Run: python3 tests/peers/test_workload_file.py (scripts/test does)."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers  # noqa: E402


def refusal(text):
    """peers.py count on a file holding `text`: its exit status and stderr."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([sys.executable, os.path.join(HERE, "peers.py"), "count", f.name],
                           capture_output=True, text=True)
        return r.returncode, r.stderr.replace(f.name, "FILE")
    finally:
        os.unlink(f.name)


class WorkloadFile(unittest.TestCase):
    def test_the_examples_make_what_they_say(self):
        pods = peers.workload_file(os.path.join(HERE, "workloads", "five-shapes.yaml"))
        self.assertEqual(len(pods), 300)
        zoned = [p for p in pods if p["spec"].get("topologySpreadConstraints")]
        self.assertEqual(len(zoned), 60)
        self.assertEqual(len({p["metadata"]["name"] for p in pods}), 300)
        for p in pods:
            self.assertEqual(p["metadata"]["labels"]["peers"], "bench")
            self.assertEqual(p["spec"]["terminationGracePeriodSeconds"], 0)
        smoke = peers.workload_file(os.path.join(HERE, "workloads", "smoke.yaml"))
        self.assertEqual([p["metadata"]["name"] for p in smoke],
                         ["zoned-0", "zoned-1", "zoned-2", "single", "small-0", "small-1"])
        self.assertEqual(peers.bought([], smoke)["cpu_requested"], 3.0)

    def test_bad_input_names_the_document_and_the_field(self):
        ok = "metadata: {name: a}\nspec: {containers: [{name: c, image: i}]}\n"
        cases = [
            ("count: 0\npod: {}\n", "FILE, document 1: count: expected a whole number of pods"),
            ("count: 2\n", "FILE, document 1: pod: expected a Pod"),
            (ok + "---\nkind: Deployment\n", "FILE, document 2: kind: expected Pod, found 'Deployment'"),
            ("spec: {containers: [{name: c, image: i}]}\n", "FILE, document 1: metadata.name"),
            ("metadata: {name: a}\nspec: {containers: []}\n", "FILE, document 1: spec.containers: expected a list"),
            ("metadata: {name: a}\nspec: {containers: [{name: c}]}\n",
             "FILE, document 1: spec.containers[0]: expected a name and an image"),
            (ok + "---\n" + ok, "FILE, document 2: metadata.name: a is made twice"),
            ("- a\n", "FILE, document 1: expected a Pod or {count: N, pod: POD}, found list"),
            ("a: [\n", "FILE: not YAML"),
            ("# nothing\n", "FILE: no pods"),
        ]
        for text, want in cases:
            code, err = refusal(text)
            self.assertNotEqual(code, 0, text)
            self.assertIn(want, err, text)


if __name__ == "__main__":
    unittest.main()
