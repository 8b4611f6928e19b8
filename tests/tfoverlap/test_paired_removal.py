"""TensorFlow runs that remove their input, their checkpoints or offload
in alternate blocks of steps: real trainer processes, real saves."""

import os

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import run_record
from overlap_core.runtime.paired_removal import WITH, WITHOUT, PairedRemoval

from tests.helpers import run_module

QUIET = ["--progress=false", "--evaluate=false", "--trace=false",
         "--tensorboard=false", "--model=mlp", "--image_size=8",
         "--batch_size=8", "--strategy=default", "--dataset=synthetic"]
# 3 ms of real CPU work per sample, in series with the step: a step with
# input waits about 24 ms for its batch.
SLOW_INPUT = ["--prefetch=0", "--map_parallelism=1",
              "--preprocess_cost_ms=3"]


def _train(model_dir, *args):
  result = run_module("tfoverlap.train", *QUIET, *args,
                      f"--model_dir={model_dir}", timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  return run_record.load_run_record(str(model_dir))


def test_the_half_without_input_waits_for_none(tmp_path):
  steps, block_steps = 12, 2
  record = _train(tmp_path, *SLOW_INPUT, f"--train_steps={steps}",
                  "--paired_removal=input",
                  f"--paired_block_steps={block_steps}")
  halves = record["paired_removal"]["halves"]
  assert {arm: h["steps"] for arm, h in halves.items()} == PairedRemoval(
      "input", block_steps).counted_steps(
          steps, ledger_lib.default_warmup_steps(steps))
  wait_ms = {arm: h["phases_ms"][ledger_lib.DATA_WAIT]
             for arm, h in halves.items()}
  # The resident batch is a Python object handed back: no wait of a
  # millisecond, against the 24 ms the pipeline's batch costs.
  assert wait_ms[WITHOUT] < 1.0 < 10.0 < wait_ms[WITH], wait_ms
  assert wait_ms[WITH] / 2 < record["paired_removal"]["saving_ms"]


def test_blocks_without_checkpoints_save_nothing_and_stall_for_none(
    tmp_path):
  # Blocks of 4 over 16 steps: with (1-4), without (5-12), with (13-16).
  record = _train(tmp_path, "--train_steps=16", "--paired_removal=checkpoint",
                  "--paired_block_steps=4", "--checkpoint=sync",
                  "--checkpoint_every=2", "--checkpoint_keep=10")
  kept = sorted(int(name.split("-")[1].split(".")[0])
                for name in os.listdir(tmp_path / "checkpoints")
                if name.startswith("ckpt-") and name.endswith(".index"))
  assert kept == [2, 4, 14, 16]
  halves = record["paired_removal"]["halves"]
  stall_ms = {arm: h["phases_ms"].get(ledger_lib.CHECKPOINT_STALL, 0.0)
              for arm, h in halves.items()}
  assert stall_ms[WITHOUT] == 0.0 < stall_ms[WITH], stall_ms


def test_the_half_without_offload_records_none_of_it(tmp_path):
  record = _train(tmp_path, "--synthetic_on_device", "--offload=activations",
                  "--train_steps=12", "--paired_removal=offload",
                  "--paired_block_steps=2")
  halves = record["paired_removal"]["halves"]
  offload_ms = {arm: h["phases_ms"].get(ledger_lib.OFFLOAD, 0.0)
                for arm, h in halves.items()}
  # A step with offload carries the derived cost, capped at its compute
  # span (a step faster than the cost, on a loaded host, carries less);
  # one without carries none.
  derived_ms = record["strategy"]["reference_step"]["offload_ms"]
  assert offload_ms[WITHOUT] == 0.0
  assert offload_ms[WITH] <= derived_ms * (1 + 1e-9)
  assert (offload_ms[WITH] > 0.0) == (derived_ms > 0.0)
