"""`overlap_compare --report_only` over runs that a user's own loop wrote.

The comparison reads its runs from the files a finished comparison leaves
(compare.json, outcomes.jsonl, each run's run.json); written here for runs
that no trainer made, it shows what the comparison makes of them.
"""

import csv
import json
import os

from tests.helpers import run_module

# One axis, for runs without and with a checkpoint callback beside the loop.
MATRIX = "checkpoint=none,async"


def compare_report(output_dir: str, framework: str, run_dirs) -> dict:
  """Writes the comparison's files naming `run_dirs` (baseline first), runs
  `python -m overlap_compare --report_only` on them, and returns its
  results.csv rows by cell label, and the report's text under "report"."""
  os.makedirs(output_dir)
  plan = {"matrix": MATRIX, "workloads": "", "frameworks": [framework],
          "repeats": 1, "trainer_args": []}
  with open(os.path.join(output_dir, "compare.json"), "w",
            encoding="utf-8") as f:
    json.dump({"plan": plan, "meta": {"title": "User loops"}}, f)
  with open(os.path.join(output_dir, "outcomes.jsonl"), "w",
            encoding="utf-8") as f:
    for choice, run_dir in enumerate(run_dirs):
      f.write(json.dumps({
          "framework": framework, "workload": [], "cell": [choice],
          "repeat": 1, "status": "ok",
          "run_dir": os.path.relpath(run_dir, output_dir), "error": "",
          "wall_s": 1.0}) + "\n")
  result = run_module("overlap_compare", "--report_only", "--noplots",
                      f"--output_dir={output_dir}", timeout=120)
  assert result.returncode == 0, result.stderr
  with open(os.path.join(output_dir, "results.csv"), encoding="utf-8") as f:
    rows = {row["cell"]: row for row in csv.DictReader(f)}
  with open(os.path.join(output_dir, "report.md"), encoding="utf-8") as f:
    rows["report"] = f.read()
  return rows
