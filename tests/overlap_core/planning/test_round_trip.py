"""Plan in one framework, train in either: the planning commands' real
output fed to both trainers' pipelines (profiles, cut layers), and a
profile made under other conditions refused in one line."""

import json
import os
import re

import pytest

from overlap_core.runtime import run_record

from tests.helpers import run_module

# The job both sides plan for and run: 2 stages of small_cnn, 2 micro-batches
# of 8. One intra-op thread everywhere: a torch stage is a process of its
# own and a TensorFlow stage shares its one process's pool, so with the
# default pools the two trainers' stages run on different thread counts,
# and a profile serves only the one whose threads it was timed on.
JOB = ("--model=small_cnn", "--image_size=8", "--batch_size=16",
       "--strategy=mirrored", "--num_devices=2", "--pipeline_stages=2",
       "--pipeline_microbatches=2", "--intra_op_threads=1")
PLANS = {"torch": "torch_parity.plan", "tensorflow": "tfoverlap.plan"}
TRAINERS = {"torch": "torch_parity.train", "tensorflow": "tfoverlap.train"}
TIMEOUT_S = 300


# The claims need a profile the command measured, not good times: each
# layer is timed once, cold, at the one micro-batch the job's stages run
# (the default of three batch sizes nearly doubles TensorFlow's planning).
PROFILE_ONCE = ("--plan_batch_sizes=8", "--plan_warmup=0", "--plan_repeats=1")


def _plan(out_dir, framework, *flags):
  result = run_module(PLANS[framework], *flags, *PROFILE_ONCE,
                      f"--plan_output_dir={out_dir}", timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-3000:]
  return out_dir


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
  """Each planning command's output directory for JOB, made once."""
  root = tmp_path_factory.mktemp("plans")
  return {fw: _plan(root / fw, fw, *JOB) for fw in PLANS}


def _train(framework, model_dir, *flags):
  return run_module(TRAINERS[framework], *JOB, *flags, "--train_steps=2",
                    "--evaluate=false", "--trace=false",
                    "--tensorboard=false", f"--model_dir={model_dir}",
                    timeout=TIMEOUT_S)


def _warnings(result):
  return [l for l in result.stderr.splitlines()
          if l.startswith("pipeline: warning:")]


# Each side's own profile driving its own trainer is run where its
# example model is (tests/examples: test_keras_regression and
# test_torch_module plan and train), and TensorFlow's again in
# tests/tfoverlap/test_pipeline.py; here each side's drives the other's.
@pytest.mark.parametrize("planner, trainer", [("tensorflow", "torch"),
                                              ("torch", "tensorflow")])
def test_either_plan_commands_profile_drives_the_others_auto_split(
    plans, tmp_path, planner, trainer):
  profile = plans[planner] / "profile.json"
  result = _train(trainer, tmp_path, "--pipeline_split=auto",
                  f"--plan_profile={profile}")
  assert result.returncode == 0, result.stderr[-3000:]
  # The other framework's profile is taken, with one line saying whose.
  assert len(_warnings(result)) == 1, result.stderr[-3000:]
  section = run_record.load_run_record(str(tmp_path))["pipeline"]
  assert section["split"] == "auto" and len(section["cut_layers"]) == 1
  for row in section["per_stage"]:
    assert row["predicted_ms"] > 0, row
  recorded = section["profile_conditions"]
  assert recorded["profile"]["framework"].startswith(planner)
  assert recorded["profile"]["threads"] == recorded["run"]["threads"] == 1
  assert recorded["run"]["batch_sizes"] == [8]
  assert 8 in recorded["profile"]["batch_sizes"]


def test_cut_layers_of_one_side_split_the_other(plans, tmp_path):
  """The cuts TensorFlow's plan prints, as the PyTorch trainer's split."""
  text = (plans["tensorflow"] / "plan.txt").read_text(encoding="utf-8")
  cuts = re.findall(r"cuts after: (\S+)", text)[0]
  result = _train("torch", tmp_path, f"--pipeline_split={cuts}")
  assert result.returncode == 0, result.stderr[-3000:]
  section = run_record.load_run_record(str(tmp_path))["pipeline"]
  assert section["cut_layers"] == [cuts]


def test_a_plan_for_a_job_no_trainer_runs_is_refused_in_one_line(tmp_path):
  # The README's old example planned stages under the default strategy,
  # which neither trainer pipelines; its profile would time layers on
  # threads no stage gets. The planner refuses it before measuring.
  job = [f for f in JOB if not f.startswith(("--strategy", "--num_devices"))]
  for framework in PLANS:
    result = run_module(PLANS[framework], *job, "--strategy=default",
                        f"--plan_output_dir={tmp_path / framework}",
                        timeout=TIMEOUT_S)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [l for l in result.stderr.splitlines() if ": error: " in l]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "--strategy=default" in lines[0] and "mirrored" in lines[0]
    assert not (tmp_path / framework).exists()


def test_a_profile_made_for_other_job_flags_is_refused_in_one_line(
    plans, tmp_path):
  # Planned with more threads than a stage of the job gets (on any host:
  # a stage of 2 processes gets at most half the cores, and at least 1).
  cores = os.cpu_count()
  profiled = max(2, cores)
  other = _plan(tmp_path / "threads", "torch", *[
      f for f in JOB if not f.startswith("--intra_op_threads")],
      f"--intra_op_threads={profiled}")
  assert json.loads((other / "profile.json").read_text())["threads"] == (
      profiled)
  job = [f for f in JOB if not f.startswith("--intra_op_threads")]
  # (trainer, profile, its threads, the threads the trainer's stages get)
  cases = (("torch", other / "profile.json", profiled, max(1, cores // 2)),
           # Timed on one thread; TensorFlow's one process runs its
           # stages on the whole host.
           ("tensorflow", plans["torch"] / "profile.json", 1, cores))
  for trainer, profile, recorded, run in cases:
    result = run_module(TRAINERS[trainer], *job, "--pipeline_split=auto",
                        f"--plan_profile={profile}", "--train_steps=2",
                        "--evaluate=false",
                        f"--model_dir={tmp_path / trainer}",
                        timeout=TIMEOUT_S)
    assert result.returncode == 2, result.stderr[-3000:]
    # One line of ours (TensorFlow logs its own start-up beside it).
    lines = [l for l in result.stderr.splitlines() if "--plan_profile=" in l]
    assert len(lines) == 1, result.stderr[-3000:]
    assert f"threads {recorded} (this run's stages: {run})" in lines[0]
    assert f"python -m {PLANS[trainer]} --model=small_cnn" in lines[0]
    assert "--strategy=mirrored --num_devices=2" in lines[0]
