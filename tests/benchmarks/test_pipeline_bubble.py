"""The balanced-pipeline benchmark's grid and summary, without a run."""

import pytest

from benchmarks import harness
from benchmarks import pipeline_bubble


class _Args:
  quick = False
  models = None
  microbatches = None
  microbatch_size = None
  framework = pipeline_bubble.PYTORCH


def _section(bubble, *, m, imbalance=0.01, residual=0.02):
  parts = {f"{name}_fraction": 0.0 for name in ("fill_drain", "transfer",
                                                 "loss_and_update")}
  parts.update(imbalance_fraction=imbalance, residual_fraction=residual)
  return {"stages": 2, "micro_batches": m, "bubble_fraction": bubble,
          "cut_layers": ["block3"], "bubble_parts": {"summary": parts},
          "per_stage": [{"compute_ms": 10.0}, {"compute_ms": 11.0}]}


def _payload(bubbles, m=8):
  setting = {"models": {"vgg16": 32}, "microbatches": [m],
             "microbatch_size": 4, "train_steps": 20, "stages": 2}
  runs = []
  for repeat, bubble in enumerate(bubbles):
    runs.append({"cell": ["vgg16", pipeline_bubble.PIPELINE, m],
                 "repeat": repeat,
                 "result": {"samples_per_second": 90.0,
                            "pipeline": _section(bubble, m=m)}})
    runs.append({"cell": ["vgg16", pipeline_bubble.UNSPLIT, m],
                 "repeat": repeat,
                 "result": {"samples_per_second": 100.0, "pipeline": None}})
  return {"setting": setting, "runs": runs}


def test_a_bubble_near_theory_meets_and_one_far_from_it_misses():
  theory = 1 / 9  # GPipe, S = 2, M = 8
  (row,) = pipeline_bubble.summarize(_payload([theory + 0.01] * 5))
  assert row["theory"] == pytest.approx(theory)
  assert row["points_from_theory"]["verdict"] == harness.MET
  assert row["pipeline_over_unsplit"]["median"] == pytest.approx(0.9)
  assert row["parts"]["imbalance"] == 0.01
  (row,) = pipeline_bubble.summarize(_payload([theory + 0.12] * 5))
  assert row["points_from_theory"]["verdict"] == harness.MISSED
  # Far below theory misses too: the measurement would be off.
  (row,) = pipeline_bubble.summarize(_payload([0.0] * 5))
  assert row["points_from_theory"]["verdict"] == harness.MISSED


def test_the_pipeline_and_the_unsplit_model_see_the_same_global_batch():
  setting = pipeline_bubble.settings(_Args)
  profiles = {"vgg16": "profile.json"}
  piped = pipeline_bubble.cell_flags(("vgg16", pipeline_bubble.PIPELINE, 8),
                                     setting, profiles)
  unsplit = pipeline_bubble.cell_flags(("vgg16", pipeline_bubble.UNSPLIT, 8),
                                       setting, profiles)
  batch = f"--batch_size={8 * pipeline_bubble.MICROBATCH_SIZE}"
  assert batch in piped and batch in unsplit
  # Two stage processes of one thread against one process of two.
  assert "--intra_op_threads=1" in piped and "--num_devices=2" in piped
  assert "--intra_op_threads=2" in unsplit
  assert "--pipeline_split=auto" in piped
  assert "--plan_profile=profile.json" in piped
  assert not any(f.startswith("--pipeline") for f in unsplit)
  assert "--pipeline_runtime=processes" not in piped


def test_a_larger_micro_batch_is_asked_for_by_flag():
  class LargerArgs(_Args):
    microbatches = "16"
    microbatch_size = 8

  setting = pipeline_bubble.settings(LargerArgs)
  assert setting["microbatches"] == [16] and setting["microbatch_size"] == 8
  piped = pipeline_bubble.cell_flags(("resnet50", pipeline_bubble.PIPELINE,
                                      16), setting, {"resnet50": "p.json"})
  assert "--batch_size=128" in piped and "--pipeline_microbatches=16" in piped


def test_tensorflow_stages_are_a_launched_job_of_server_processes():
  class TensorFlowArgs(_Args):
    framework = "tensorflow_processes"

  setting = pipeline_bubble.settings(TensorFlowArgs)
  pipeline_cell = ("vgg16", pipeline_bubble.PIPELINE, 8)
  unsplit_cell = ("vgg16", pipeline_bubble.UNSPLIT, 8)
  piped = pipeline_bubble.cell_flags(pipeline_cell, setting,
                                     {"vgg16": "profile.json"})
  assert "--pipeline_runtime=processes" in piped
  assert "--intra_op_threads=1" in piped and "--inter_op_threads=1" in piped
  assert pipeline_bubble.launched(pipeline_cell, "tensorflow_processes")
  assert pipeline_bubble.cell_module(
      pipeline_cell, "tensorflow_processes") == "tfoverlap.launch"
  assert not pipeline_bubble.launched(unsplit_cell, "tensorflow_processes")
  assert pipeline_bubble.cell_module(
      unsplit_cell, "tensorflow_processes") == "tfoverlap.train"
  # Each framework's results in a file of its own.
  assert pipeline_bubble.results_name("pytorch") == "pipeline_bubble"
  assert (pipeline_bubble.results_name("tensorflow_processes")
          == "pipeline_bubble_tensorflow_processes")
