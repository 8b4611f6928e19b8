"""benchmarks.trainer_overhead and benchmarks.torch_trainer_overhead, at a
few steps: both sides of a preset trained in the one process that serves
them (their default), and the results file says so. The numbers are not
looked at."""

import json
import subprocess
import sys

from tests.helpers import REPO_ROOT, subprocess_env


def _quick(driver, *args, tmp_path):
  output = tmp_path / f"{driver}.json"
  done = subprocess.run(
      [sys.executable, "-m", f"benchmarks.{driver}", "--quick",
       "--redo_busy=0", f"--output={output}", *args],
      cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True,
      timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(output.read_text(encoding="utf-8"))


def _one_process_served(payload, sides):
  assert payload["sides_in"] == "one_process"
  runs = payload["runs"]
  assert sorted(r["side"] for r in runs) == sorted(sides)
  assert len({r["result"]["side_process_pid"] for r in runs}) == 1


def test_the_pytorch_driver_runs_both_sides_in_one_process(tmp_path):
  payload = _quick("torch_trainer_overhead",
                   "--configs=small_cnn_digits_default", "--train_steps=6",
                   tmp_path=tmp_path)
  _one_process_served(payload, ["plain_loop", "torch_parity"])


def test_the_keras_driver_runs_its_three_sides_in_one_process(tmp_path):
  # Mirrored over two logical CPU devices, which TensorFlow lets a process
  # configure once: every side after the first finds them made.
  payload = _quick("trainer_overhead", "--model=small_cnn",
                   "--dataset=digits", "--image_size=16", "--batch_size=16",
                   "--strategy=mirrored", "--num_devices=2",
                   tmp_path=tmp_path)
  _one_process_served(payload, ["plain_fit", "tfoverlap_ctl",
                                "tfoverlap_fit"])
