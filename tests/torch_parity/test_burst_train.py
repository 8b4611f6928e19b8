"""The PyTorch trainer runs a burst plan: 2 launched gloo ranks against one
process on the same data."""

import pytest

from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.planning.burst import BurstPlan
from overlap_core.runtime import run_record
from torch_parity.planning.graph import build_zoo_graph

from tests import checkpoint_support
from tests.burst_plans import plan_with_command, write_plan
from tests.helpers import run_module

BATCH = 16
RUN = ("--model=mlp", "--dataset=digits", "--image_size=8",
       f"--batch_size={BATCH}", "--train_steps=6", "--optimizer=momentum",
       "--learning_rate=0.05",
       "--deterministic", "--log_every_steps=3", "--tensorboard=false",
       "--trace=false", "--prefetch=1")
PREDICTED_ITERATION_S = 0.004
# The same per-sample terms, summed in two halves and then across the two
# ranks instead of in one GEMM: float32 rounding of a few ulps per step.
# Six momentum-SGD steps carry it into the weights and back into the loss,
# still orders of magnitude below 1e-4 relative on losses of order 1 (a
# wrong gradient, e.g. one half's missing, moves the loss by percents).
LOSS_RTOL = 1e-4


def _write_plan(path) -> BurstPlan:
  """Two widths: the wide first layers, a narrow middle, a wide head.

  Chosen, not planned: telling two ranks' burst run from data parallelism
  needs widths 1 and 2 both, which the command does not promise."""
  graph = build_zoo_graph("mlp", image_size=8, batch_size=2)
  narrow = ("fc2", "relu_1")  # fc2 and its ReLU
  widths = {n.name: 1 if n.name in narrow else 2 for n in graph.nodes}
  return write_plan(path, widths, model="mlp", global_batch=BATCH,
                    num_devices=2, iteration_s=PREDICTED_ITERATION_S)


# Synchronous checkpoints do not change what a run computes, so the burst
# run that must train like one process also leaves rank 0's checkpoint of
# step 3 for the resume test, and is that test's uninterrupted run.
CHECKPOINTS = ("--checkpoint=sync", "--checkpoint_every=3")


@pytest.fixture(scope="module")
def burst_run(tmp_path_factory):
  """Two ranks on the chosen plan, six steps: (plan, its path, model_dir)."""
  root = tmp_path_factory.mktemp("burst")
  plan_path = root / "plan.json"
  plan = _write_plan(plan_path)
  result = run_module("torch_parity.launch", "--num_workers=2", "--", *RUN,
                      *CHECKPOINTS, f"--burst_parallel={plan_path}",
                      f"--model_dir={root / 'run'}", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return plan, plan_path, root / "run"


def test_two_rank_burst_plan_trains_like_one_process(tmp_path, burst_run):
  plan, _, burst_dir = burst_run
  assert sorted(set(plan.widths_by_layer().values())) == [1, 2]
  one = run_module("torch_parity.train", *RUN, "--strategy=default",
                   "--intra_op_threads=1", f"--model_dir={tmp_path / 'one'}",
                   timeout=300)
  assert one.returncode == 0, one.stderr[-3000:]

  reference = run_record.load_run_record(str(tmp_path / "one"))
  chief = run_record.load_run_record(str(burst_dir))
  other = run_record.load_run_record(str(burst_dir / "worker-1"))
  for record in (chief, other):
    for key in ("train_loss", "eval_loss"):
      assert record["final"][key] == pytest.approx(
          reference["final"][key], rel=LOSS_RTOL), key
  # Every rank ends holding rank 0's whole model.
  assert chief["weights_digest"] == other["weights_digest"]
  section = chief["strategy"]["burst"]
  assert section["widths_by_layer"] == plan.widths_by_layer()
  assert section["predicted_iteration_ms"] == pytest.approx(
      PREDICTED_ITERATION_S * 1e3)
  assert section["measured_step_ms"] > 0
  assert chief["strategy"]["class"] == "torch_parity.burst.BurstModel"


def test_a_resumed_burst_run_ends_like_an_uninterrupted_one(tmp_path,
                                                           burst_run):
  _, plan_path, whole_dir = burst_run
  # The run as a stop after step 3 leaves it: rank 0's checkpoint of step 3
  # and nothing later.
  assert checkpoint_files.list_checkpoints(
      str(whole_dir / "checkpoints")) == [3, 6]
  checkpoint_support.resume_from(whole_dir, tmp_path, drop=(6,))
  result = run_module(
      "torch_parity.launch", "--num_workers=2", "--", *RUN,
      "--evaluate=false", *CHECKPOINTS,
      f"--burst_parallel={plan_path}",
      f"--model_dir={tmp_path}", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  # Rank 0's checkpoint holds every layer; a deterministic run resumed
  # from it on both ranks takes bit-identical steps.
  checkpoint_support.check_resumed_like(tmp_path, whole_dir, step=3,
                                        num_steps=3)


@pytest.mark.parametrize("extra, message", [
    (("--precision=mixed_bfloat16",), "--precision=mixed_bfloat16"),
])
def test_what_does_not_combine_is_refused_in_one_line(tmp_path, extra,
                                                      message):
  plan_path = tmp_path / "plan.json"
  _write_plan(plan_path)
  result = run_module("torch_parity.launch", "--num_workers=2", "--", *RUN,
                      f"--burst_parallel={plan_path}", *extra,
                      f"--model_dir={tmp_path / 'run'}", timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert message in result.stderr
  assert "Traceback" not in result.stderr


# The planning command's own plan, shared by the tests below: small_cnn at
# its smallest, a batch of 8 over 2 ranks.
COMMAND_RUN = ("--model=small_cnn", "--dataset=digits", "--image_size=8",
               "--batch_size=8", "--train_steps=2", "--evaluate=false",
               "--tensorboard=false", "--trace=false", "--prefetch=1")


@pytest.fixture(scope="module")
def command_plan(tmp_path_factory):
  return plan_with_command(tmp_path_factory.mktemp("plan"),
                           model="small_cnn", image_size=8, batch_size=8)


def test_a_plan_from_the_command_runs_on_two_ranks(command_plan, tmp_path):
  result = run_module("torch_parity.launch", "--num_workers=2", "--",
                      *COMMAND_RUN, f"--burst_parallel={command_plan}",
                      f"--model_dir={tmp_path}", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  plan = BurstPlan.from_json(command_plan.read_text())
  section = run_record.load_run_record(str(tmp_path))["strategy"]["burst"]
  assert section["widths_by_layer"] == plan.widths_by_layer()
  assert section["measured_step_ms"] > 0


def test_a_plan_for_another_model_is_refused(command_plan, tmp_path):
  result = run_module("torch_parity.launch", "--num_workers=2", "--",
                      *COMMAND_RUN, "--model=mlp",
                      f"--burst_parallel={command_plan}",
                      f"--model_dir={tmp_path}", timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if ": error: " in l]
  assert len(errors) == 1 and (
      "the plan is for model 'small_cnn', not --model=mlp" in errors[0]), (
          result.stderr[-3000:])
  assert "Traceback" not in result.stderr
