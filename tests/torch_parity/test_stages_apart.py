"""A pipeline's stages run apart: the pipeline's work without its waits.

`--pipeline_stages_apart` is the bubble's intervention in
`benchmarks/ledger_fidelity.py`: each stage computes on stand-ins for its
neighbours' tensors. The same stand-ins time each stage alone before
training, for the pipeline's contention phase. These real two-rank runs
check that the stand-ins are what the neighbours would have sent on the
first batch, that no transfer is left to time, and that timing the stage
alone changes nothing the run trains.
"""

import pytest

from overlap_core.runtime import contention, paired_removal, pipeline_stats
from overlap_core.runtime import run_record

from tests.helpers import run_module

# small_cnn has neither BatchNorm nor dropout, so the stand-ins, made in
# eval mode, are the first step's activations exactly.
JOB = ["--model=small_cnn", "--dataset=synthetic", "--image_size=16",
       "--batch_size=16", "--strategy=mirrored", "--num_devices=2",
       "--pipeline_stages=2", "--pipeline_microbatches=4",
       "--pipeline_split=even", "--synthetic_on_device", "--deterministic",
       "--evaluate=false", "--progress=false", "--trace=false",
       "--tensorboard=false"]


def _train(tmp_path_factory, name, *args):
  model_dir = tmp_path_factory.mktemp(name)
  result = run_module("torch_parity.train", f"--model_dir={model_dir}",
                      *JOB, *args, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  return run_record.load_run_record(str(model_dir))


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
  """One step each: the pipeline with its stages timed alone first (the
  default), the same without, and its stages apart."""
  return (_train(tmp_path_factory, "pipeline", "--train_steps=1"),
          _train(tmp_path_factory, "untimed", "--train_steps=1",
                 "--reference_steps=0"),
          _train(tmp_path_factory, "apart", "--train_steps=1",
                 "--pipeline_stages_apart"))


def test_on_the_first_batch_stages_apart_do_the_pipelines_work(one_step):
  pipelined, _, apart = one_step
  # The last stage's loss came from the activations stage 0 would have
  # sent, and stage 0's update from the gradients stage 1 would have sent
  # back: the same loss and the same weights after the step.
  assert apart["final"]["train_loss"] == pipelined["final"]["train_loss"]
  assert apart["weights_digest"] == pipelined["weights_digest"]
  assert apart["strategy"]["pipeline"]["stages_apart"] is True
  assert pipelined["strategy"]["pipeline"]["stages_apart"] is False


def test_stages_apart_transfer_nothing(one_step):
  # No stage sends or receives: what is left to wait for is the step's
  # closing loss all-reduce, which the ledger counts as bubble.
  apart = one_step[2]
  assert pipeline_stats.TRANSFER not in apart["phases"]
  assert "bubble" in apart["phases"]  # the step was timed, by stage
  assert len(apart["pipeline"]["per_stage"]) == 2
  for stage in apart["pipeline"]["per_stage"]:
    assert not stage["transfer_ms"], stage


def test_timing_each_stage_alone_first_changes_nothing_it_trains(one_step):
  # The stages are timed before the first step: had that changed any
  # weight or the data, the step would differ.
  timed, untimed, _ = one_step
  assert timed["weights_digest"] == untimed["weights_digest"]
  assert timed["final"]["train_loss"] == untimed["final"]["train_loss"]
  # Each stage's compute beyond its work timed alone is contention, what
  # the pipeline's sends, receives and schedule cost beside the work.
  assert contention.CONTENTION in timed["phases_derived"]
  assert contention.CONTENTION in timed["phases"]
  assert contention.CONTENTION not in untimed["phases"]


def test_stage_replicas_time_their_stage_without_the_all_reduce(
    tmp_path_factory):
  # 2 stages x 2 replicas: four ranks, each timing its stage alone first.
  record = _train(tmp_path_factory, "replicas", "--train_steps=3",
                  "--num_devices=4")
  assert record["strategy"]["pipeline"]["data_parallel"] == 2
  reference = record["strategy"]["reference_step"]
  # Timed without the replicas' gradient all-reduce, whose wait is the
  # run's exposed_comm and whose cost beside backward is contention.
  assert reference["with_all_reduce"] is False
  assert contention.CONTENTION in record["phases_derived"]
  assert record["phases"][pipeline_stats.EXPOSED_COMM]["mean"] > 0.0


def test_steps_apart_in_alternate_blocks_transfer_nothing(tmp_path_factory):
  # --paired_removal=pipeline_waits: blocks of 2 steps, with, without,
  # without, with; every rank numbers its steps alike, so the ranks'
  # steps apart are the same steps.
  record = _train(tmp_path_factory, "paired", "--train_steps=8",
                  f"--paired_removal={paired_removal.PIPELINE_WAITS}",
                  "--paired_block_steps=2")
  section = record["paired_removal"]
  assert section["cause"] == paired_removal.PIPELINE_WAITS
  halves = section["halves"]
  assert halves[paired_removal.WITH]["steps"] > 0
  assert halves[paired_removal.WITHOUT]["steps"] > 0
  # The pipeline's steps send and receive; the steps apart do not.
  assert halves[paired_removal.WITH]["phases_ms"][
      pipeline_stats.TRANSFER] > 0
  assert halves[paired_removal.WITHOUT]["phases_ms"][
      pipeline_stats.TRANSFER] == 0
  # Each half's compute beyond the stage timed alone is its contention.
  assert contention.CONTENTION in halves[paired_removal.WITHOUT]["phases_ms"]
