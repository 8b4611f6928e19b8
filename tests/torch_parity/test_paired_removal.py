"""PyTorch runs that remove their input, or offload, in alternate blocks
of steps: real trainer processes."""

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import run_record
from overlap_core.runtime.paired_removal import WITH, WITHOUT, PairedRemoval

from tests.helpers import run_module

STEPS, BLOCK_STEPS = 12, 2
# 3 ms of real CPU work per sample, in series with the step (no prefetch,
# one call at a time): a step with input waits about 24 ms for its batch.
INPUT_BOUND = ["--model=mlp", "--image_size=8", "--batch_size=8",
               "--strategy=default", "--dataset=synthetic", "--prefetch=0",
               "--map_parallelism=1", "--preprocess_cost_ms=3"]


def test_the_half_without_input_waits_for_none_and_saves_the_wait(
    tmp_path):
  result = run_module(
      "torch_parity.train", *INPUT_BOUND, f"--train_steps={STEPS}",
      "--paired_removal=input", f"--paired_block_steps={BLOCK_STEPS}",
      "--progress=false", "--evaluate=false", "--trace=false",
      "--tensorboard=false", f"--model_dir={tmp_path}", timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  paired = run_record.load_run_record(str(tmp_path))["paired_removal"]
  counts = PairedRemoval("input", BLOCK_STEPS).counted_steps(
      STEPS, ledger_lib.default_warmup_steps(STEPS))
  assert {arm: h["steps"] for arm, h in paired["halves"].items()} == counts
  wait_ms = {arm: h["phases_ms"][ledger_lib.DATA_WAIT]
             for arm, h in paired["halves"].items()}
  # A resident batch is handed over without work: no wait of a
  # millisecond, against the 24 ms the pipeline's batch costs.
  assert wait_ms[WITHOUT] < 1.0 < 10.0 < wait_ms[WITH], wait_ms
  # The saving is the wait, less what the step itself jitters: more than
  # half the wait, never more than the whole step with input.
  assert wait_ms[WITH] / 2 < paired["saving_ms"] < (
      paired["halves"][WITH]["phases_ms"]["step"])


def test_the_half_without_offload_records_none_of_it(tmp_path):
  steps = 12
  result = run_module(
      "torch_parity.train", "--model=mlp", "--image_size=8",
      "--batch_size=8", "--strategy=default", "--dataset=synthetic",
      "--synthetic_on_device", "--offload=activations",
      f"--train_steps={steps}", "--paired_removal=offload",
      f"--paired_block_steps={BLOCK_STEPS}", "--progress=false",
      "--evaluate=false", "--trace=false", "--tensorboard=false",
      f"--model_dir={tmp_path}", timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  record = run_record.load_run_record(str(tmp_path))
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
