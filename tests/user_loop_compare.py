"""Runs that a user's own loop wrote through a ledger, as both sides'
test_ledger.py check them: the run record and progress a plain loop leaves,
and `overlap_compare --report_only` over them.

The comparison reads its runs from the files a finished comparison leaves
(compare.json, outcomes.jsonl, each run's run.json); written here for runs
that no trainer made, it shows what the comparison makes of them.
"""

import csv
import json
import os

import pytest

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import run_record

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


def check_plain_run(root: str, runs: dict, *, framework: str,
                    num_steps: int, weights_digest) -> tuple:
  """The loop of `num_steps` steps without checkpoints, runs["plain"] (its
  ledger, its output, its model), its ledger logging every 4: the run.json
  the trainers write in root/plain, and their progress lines.

  Args:
    weights_digest: the side's trainer's digest of a model's weights.

  Returns:
    (the run record, the output, the model), for the side's own checks.
  """
  ledger, output, model = runs["plain"]
  run_dir = os.path.join(root, "plain")
  record = run_record.load_run_record(run_dir)
  assert record == ledger.record
  assert record["framework"] == framework
  assert record["steps"] == num_steps
  assert record["weights_digest"] == weights_digest(model)
  assert record["final"]["train_loss"] == pytest.approx(ledger.last_loss)
  assert record["phases"][ledger_lib.COMPUTE]["total"] > 0
  assert record["phases"][ledger_lib.CHECKPOINT_STALL]["total"] == 0
  # Progress lines at the cadence, with the run's length, then the table.
  assert "step 4/8  loss" in output and "step 8/8  loss" in output
  assert "Per-step breakdown (7 steps after 1 warm-up" in output
  assert record["outputs"]["run_record"] in output
  return record, output, model


def check_compared(output_dir: str, framework: str, root: str,
                   checkpointed: str) -> dict:
  """The comparison of the plain loop's run (root/plain) and a
  checkpointed one's (root/`checkpointed`): both read, the checkpoint's
  stall seen in the second alone.

  Returns:
    compare_report's rows, for the side's own columns.
  """
  rows = compare_report(output_dir, framework,
                        [os.path.join(root, "plain"),
                         os.path.join(root, checkpointed)])
  plain, checkpointed = rows["baseline"], rows["checkpoint=async"]
  assert plain["status"] == checkpointed["status"] == "ok"
  assert float(plain["checkpoint_stall_ms"]) == 0
  assert float(checkpointed["checkpoint_stall_ms"]) > 0
  return rows
