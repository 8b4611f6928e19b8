"""The GPU campaign cannot rot: its table holds, and its dry run runs.

The dry run builds every part's commands and runs the first of each with
tiny sizes on this CPU host, TensorFlow made unimportable as on the GPU
machine; its files go to a temporary directory, never benchmarks/results.
"""

import json
import os
import re
import subprocess
import sys

from overlap_core.runtime import zoo
from benchmarks.gpu_campaign import parts
from benchmarks.gpu_campaign.__main__ import CALLS
from tests.helpers import REPO_ROOT, subprocess_env


def _campaign(*args, timeout=600):
  return subprocess.run([sys.executable, "-m", "benchmarks.gpu_campaign",
                         *args], cwd=REPO_ROOT, env=subprocess_env(),
                        capture_output=True, text=True, timeout=timeout,
                        check=False)


def test_the_parts_fit_their_limits_and_name_zoo_models():
  assert all(p.minutes <= parts.PART_LIMIT_MIN for p in parts.PARTS)
  assert sum(p.minutes for p in parts.PARTS) <= parts.CAMPAIGN_LIMIT_MIN
  # Every part sits in exactly one 10-minute call, with room to start.
  called = [name for call in CALLS for name in call]
  assert sorted(called) == sorted(parts.PARTS_BY_NAME)
  for call in CALLS:
    assert sum(parts.PARTS_BY_NAME[n].minutes for n in call) <= 9
  for part in parts.PARTS:
    assert set(part.models) <= set(zoo.MODEL_NAMES), part.name


def test_every_module_with_a_cuda_test_is_in_the_cuda_tests_part():
  marked = set()
  for directory, _, files in os.walk(os.path.join(REPO_ROOT, "tests")):
    for name in files:
      path = os.path.join(directory, name)
      if name.startswith("test_") and name.endswith(".py"):
        with open(path, encoding="utf-8") as f:
          text = f.read()
        if re.search(r"^@needs_cuda$", text, re.MULTILINE):
          marked.add(os.path.relpath(path, REPO_ROOT))
          # The GPU machine has no TensorFlow to import.
          assert "import tensorflow" not in text, path
  assert marked == set(parts.CUDA_TEST_FILES)


def _failed_outputs(results_dir) -> str:
  """The end of each failed command's own output, from the parts' files:
  the runner's log says only that a command failed."""
  tails = []
  for path in sorted(results_dir.glob("*.json")):
    for row in json.loads(path.read_text(encoding="utf-8"))["commands"]:
      if row["status"].startswith(("failed", "timed out")):
        tails.append(f"{row['command']}\n{row.get('output_tail', '')}")
  return "\n".join(tails)


def test_dry_run_builds_every_part_and_runs_their_first_commands(tmp_path):
  done = _campaign("--dry_run", f"--results_dir={tmp_path}")
  assert done.returncode == 0, (done.stdout[-3000:] + done.stderr[-3000:] +
                                _failed_outputs(tmp_path))
  for part in parts.PARTS:
    with open(tmp_path / f"{part.name}.json", encoding="utf-8") as f:
      payload = json.load(f)
    assert payload["dry_run"] and payload["ok"], payload
    # What it ran on, commit included.
    assert payload["environment"]["torch"] and payload["environment"]["commit"]
    rows = payload["commands"]
    assert [r["label"] for r in rows] == [c.label for c in part.commands]
    first = part.commands[0]
    if first.dry_args is None:
      assert rows[0]["status"] == "built, not run: needs CUDA"
    else:
      assert rows[0]["status"] == "ran" and rows[0]["result"], rows[0]
  with open(tmp_path / "cuda_tests.json", encoding="utf-8") as f:
    tests = json.load(f)["commands"][0]["result"]
  # Collected without TensorFlow; here every one of them skips.
  assert tests["counts"] == {"skipped": len(tests["tests"])}
  assert len(tests["tests"]) >= len(parts.CUDA_TEST_FILES)
  with open(tmp_path / "checkpoint.json", encoding="utf-8") as f:
    checkpoint = json.load(f)
  assert any("tf_async" in n for n in checkpoint["notes"])
  assert "tf_async" in checkpoint["commands"][0]["result"]["not_run"]


def test_a_host_without_cuda_is_refused_in_one_line():
  done = _campaign("--part=offload_a", timeout=120)
  assert done.returncode == 2
  assert done.stderr.strip().count("\n") == 0
  assert "--dry_run" in done.stderr
