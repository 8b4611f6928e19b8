"""python -m tfoverlap.burst_plan: a plan measured in TensorFlow, which the
TensorFlow trainer then runs."""

from overlap_core.planning.burst import BurstPlan
from overlap_core.planning.graph import LayerGraph
from overlap_core.runtime import run_record

from tests.helpers import run_module

JOB = ("--model=small_cnn", "--image_size=8", "--batch_size=8",
       "--strategy=mirrored", "--num_devices=2", "--intra_op_threads=1")
TIMEOUT_S = 300


def test_a_tensorflow_plan_runs_in_the_tensorflow_trainer(tmp_path):
  out = tmp_path / "plan"
  planned = run_module("tfoverlap.burst_plan", *JOB, "--plan_warmup=0",
                       "--plan_repeats=1", "--amplification_limit=2",
                       "--plan_bandwidth_gbps=10",
                       f"--plan_output_dir={out}", timeout=TIMEOUT_S)
  assert planned.returncode == 0, planned.stderr[-3000:]
  plan = BurstPlan.from_json((out / "burst_plan.json").read_text())
  graph = LayerGraph.from_json((out / "graph.json").read_text())
  assert (plan.model, plan.num_devices, plan.global_batch) == (
      "small_cnn", 2, 8)
  # Keras' layers by their neutral names, what both trainers read.
  assert [lp.layer for lp in plan.layers] == list(
      graph.neutral_names().values())

  trained = run_module("tfoverlap.train", *JOB, "--dataset=digits",
                       "--train_steps=2", "--evaluate=false",
                       "--tensorboard=false", "--trace=false", "--prefetch=1",
                       f"--burst_parallel={out / 'burst_plan.json'}",
                       f"--model_dir={tmp_path / 'run'}", timeout=TIMEOUT_S)
  assert trained.returncode == 0, trained.stderr[-3000:]
  section = run_record.load_run_record(str(tmp_path / "run"))["strategy"][
      "burst"]
  # The trainer ran the widths this plan gave each layer it has.
  planned_widths = plan.widths_by_layer()
  assert section["widths_run"] == {
      layer: planned_widths[layer] for layer in section["widths_run"]}
  assert section["widths_run"]
