"""A pipelined PyTorch run measures each stage: compute, bubble, transfer.

One real 2-stage GPipe run of the trainer (two processes over gloo), with
a layer profile measured here so that the split is `auto` and every stage
has a predicted time beside its measured one.
"""

import json

import torch

from overlap_core.runtime import pipeline_stats
from torch_parity.models import build_model
from torch_parity.planning.profiler import profile_layers

from tests.helpers import run_module

IMAGE_SIZE = 8
# Two ranks of a small CNN at 8 px on a loaded 2-core host: seconds a run;
# the limit only guards against a gloo hang (pytorch/pytorch#132644).
RUN_TIMEOUT_S = 300
STEPS = 6
TRAIN_FLAGS = ["--model=small_cnn", "--dataset=synthetic",
               f"--image_size={IMAGE_SIZE}", "--batch_size=8",
               f"--train_steps={STEPS}", "--strategy=mirrored",
               "--num_devices=2", "--pipeline_stages=2",
               "--pipeline_microbatches=2", "--pipeline_schedule=gpipe",
               "--pipeline_split=auto", "--evaluate=false",
               "--tensorboard=false", "--trace=false", "--progress=false",
               "--intra_op_threads=1", "--inter_op_threads=1"]


def _write_profile(path) -> None:
  """A real profile of the model the trainer builds (its layer names)."""
  torch.manual_seed(0)
  model = build_model("small_cnn", image_size=IMAGE_SIZE, num_classes=10)
  # Timed on the one thread each stage runs on: the trainer refuses a
  # profile measured on other threads than its stages get.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    profile = profile_layers(
        model, lambda batch: torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE),
        batch_sizes=(2, 4, 8), warmup=1, repeats=2, name="small_cnn",
        optimizer_factory=torch.optim.Adam, optimizer_name="adam")
  finally:
    torch.set_num_threads(threads)
  path.write_text(profile.to_json(), encoding="utf-8")


def test_gpipe_run_records_stage_phases_and_predictions(tmp_path):
  profile = tmp_path / "profile.json"
  _write_profile(profile)
  result = run_module("torch_parity.train", *TRAIN_FLAGS,
                      f"--plan_profile={profile}",
                      f"--model_dir={tmp_path / 'run'}",
                      timeout=RUN_TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "run" / "run.json", encoding="utf-8") as f:
    record = json.load(f)
  section = record["pipeline"]
  assert section["schedule"] == "gpipe" and section["split"] == "auto"
  assert section["stages"] == 2 and section["micro_batches"] == 2
  assert section["bubble_fraction_theory"] == 1 / 3  # (S-1)/(M+S-1), M=S=2
  assert [row["stage"] for row in section["per_stage"]] == [0, 1]
  assert section["cut_layers"] == [section["per_stage"][0]["layers"][-1]]
  for row in section["per_stage"]:
    assert row["compute_ms"] > 0
    # GPipe with M = S: stage 0 idles while stage 1 runs the last forward
    # and the first backward; stage 1 idles while the first forward fills.
    assert row["bubble_ms"] > 0, row
    # Posting every send and receive takes some time on both stages.
    assert row["transfer_ms"] > 0, row
    assert row["predicted_ms"] > 0 and row["predicted_memory_mb"] > 0
    # Both stages hold weights, so both update; the update is a part of
    # stage_compute, and so is the prediction's.
    assert 0 < row["update_ms"] < row["compute_ms"], row
    assert 0 < row["predicted_update_ms"] < row["predicted_ms"], row
  assert 0 < section["bubble_fraction"] < 1
  phases = record["phases"]
  assert set(pipeline_stats.PHASES) <= set(record["phases_measured"])
  assert "compute" not in record["phases_measured"]
  assert phases["compute"]["total"] == 0.0  # replaced, not double-counted
  # The three phases partition the compute span of each step: with data
  # wait and checkpoint stall they stay within the step (the rest is the
  # ledger's "other", never negative). Sums of floats of one clock: a
  # nanosecond of slack for rounding.
  pipelined = sum(phases[p]["total"] for p in pipeline_stats.PHASES)
  assert 0 < pipelined
  assert pipelined + phases["data_wait"]["total"] <= (
      phases["step"]["total"] + 1e-9)
  assert phases["other"]["p50"] >= -1e-9
