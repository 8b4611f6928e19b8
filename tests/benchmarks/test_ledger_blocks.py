"""benchmarks.fit_ledger_blocks and loop_ledger_blocks: the ledger switched
on and off in blocks of one fit (Keras) or one loop (PyTorch).

The numbers of the smoke run are not looked at; what is checked is that
the blocks alternate as documented, that each step's time is given to the
side whose block it is in, and that the ledger saw exactly the "on" steps.
"""

import json
import subprocess
import sys

import pytest

from benchmarks import fit_ledger_blocks as blocks
from tests.helpers import REPO_ROOT, subprocess_env


def test_a_cycle_is_off_on_on_off_in_blocks():
  cycle = [blocks.block_side(i) for i in range(blocks.CYCLE_STEPS)]
  size = blocks.BLOCK_STEPS
  assert cycle == ([blocks.OFF] * size + [blocks.ON] * 2 * size
                   + [blocks.OFF] * size)
  # The next cycle repeats it.
  assert [blocks.block_side(blocks.CYCLE_STEPS + i)
          for i in range(blocks.CYCLE_STEPS)] == cycle


def test_each_counted_step_goes_to_its_blocks_side():
  # Steps of 1 ms off and 3 ms on, stamped when each ends: the first
  # cycle is warm-up, every later step is timed from the stamp before it.
  num_steps = 3 * blocks.CYCLE_STEPS
  stamps_s, now_s = [], 0.0
  for index in range(num_steps):
    now_s += 0.003 if blocks.block_side(index) == blocks.ON else 0.001
    stamps_s.append(now_s)
  steps = blocks.steps_by_side(stamps_s)
  counted = num_steps - blocks.CYCLE_STEPS
  assert len(steps[blocks.OFF]) == len(steps[blocks.ON]) == counted // 2
  assert steps[blocks.OFF] == pytest.approx([0.001] * (counted // 2))
  assert steps[blocks.ON] == pytest.approx([0.003] * (counted // 2))


@pytest.mark.parametrize("module, example, flag", [
    ("fit_ledger_blocks", "keras_regression",
     "--model=examples.keras_regression.model:build"),
    ("loop_ledger_blocks", "torch_module",
     "--model=examples.torch_module.model:build"),
])
def test_quick_run_times_both_sides_and_the_ledger_sees_the_on_steps(
    tmp_path, module, example, flag):
  output = tmp_path / f"{module}.json"
  done = subprocess.run(
      [sys.executable, "-m", f"benchmarks.{module}", "--quick",
       "--redo_busy=0", f"--output={output}"],
      cwd=REPO_ROOT, env=subprocess_env(TF_CPP_MIN_LOG_LEVEL="2"),
      capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  payload = json.loads(output.read_text(encoding="utf-8"))
  assert payload["benchmark"] == module
  assert payload["repeats"] == 1 and payload["quick"]
  assert payload["example"] == example and flag in payload["flags"]
  (run,) = payload["runs"]
  result = run["result"]
  steps = payload["steps_per_run"]
  counted = (steps - payload["warmup_steps"]) // 2
  assert result[blocks.OFF]["steps"] == result[blocks.ON]["steps"] == counted
  # The gate passed the ledger the "on" blocks' steps, the warm-up
  # cycle's included, and no other.
  assert result["ledger_steps"] == steps // 2
  assert result["ratio"] == pytest.approx(
      result[blocks.ON]["mean_ms"] / result[blocks.OFF]["mean_ms"])
  # One run gives no interval, so no verdict is declared.
  assert payload["summary"]["judged"]["verdict"] == "noisy"
  assert example in done.stdout
