"""python -m overlap_compare end to end: real trainer subprocesses, real run.json.

Kept small for 2-core machines: an MLP on synthetic 8x8 images, a few
steps, one repeat, and one comparison shared by the tests that only read
what it left.
"""

import csv
import os
import signal
import subprocess
import sys

import pytest

from overlap_core.runtime import run_record

from tests.helpers import REPO_ROOT, run_module, subprocess_env, wait_until

TINY = ["--model=mlp", "--dataset=synthetic", "--image_size=8",
        "--batch_size=32", "--strategy=default", "--train_steps=12",
        "--checkpoint_every=4"]


def read_csv(path):
  with open(path, encoding="utf-8") as f:
    return list(csv.DictReader(f))


# One comparison serves the matrix's and the pipelines' claims: a pipeline
# axis crossed with a checkpoint axis PyTorch refuses half of, on the two
# logical devices a pipeline needs. 6 trainer runs and 2 refusals, where
# a matrix apiece took 10 runs and 2 refusals.
MATRIX_JOB = ["--model=mlp", "--dataset=synthetic", "--image_size=8",
              "--batch_size=32", "--train_steps=8", "--checkpoint_every=4",
              "--strategy=mirrored", "--num_devices=2",
              "--pipeline_microbatches=4", "--pipeline_split=even"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
  """The comparison's output directory, its stdout and stderr, and the
  report it first wrote."""
  out = tmp_path_factory.mktemp("matrix") / "report"
  result = run_module(
      "overlap_compare",
      "--matrix=pipeline_stages=1,2;checkpoint=none,tf_async",
      "--frameworks=tensorflow,pytorch", "--repeats=1",
      f"--output_dir={out}", "--", *MATRIX_JOB, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  return out, result, (out / "report.md").read_text()


def test_tiny_matrix_in_both_frameworks(matrix):
  out, result, report = matrix
  assert result.stdout.strip().endswith(str(out / "report.md"))
  for index in range(1, 9):
    assert f"] {index}/8 " in result.stderr  # a progress line per run

  runs = read_csv(out / "runs.csv")
  assert len(runs) == 8
  ok = [r for r in runs if r["status"] == "ok"]
  refused = [r for r in runs if r["status"] == "unsupported"]
  # PyTorch has no counterpart of TensorFlow's own async save.
  assert {(r["framework"], r["cell"]) for r in refused} == {
      ("pytorch", "checkpoint=tf_async"),
      ("pytorch", "pipeline_stages=2 + checkpoint=tf_async")}
  assert all("--checkpoint=tf_async" in r["error"] for r in refused)
  assert len(ok) == 6

  records = {}
  for row in ok:
    record = run_record.load_run_record(str(out / row["run_dir"]))
    records[(row["framework"], row["cell"])] = record
    # The run really ran this cell, under the common flags.
    assert record["framework"] == row["framework"]
    assert record["model"]["name"] == "mlp"
    assert record["steps"] == 8
    assert record["flags"]["data"]["image_size"] == 8
    assert record["flags"]["pipeline"]["stages"] == (
        2 if "pipeline_stages=2" in row["cell"] else 1)
    assert record["flags"]["checkpoint"]["mode"] == (
        "tf_async" if "tf_async" in row["cell"] else "none")
    # runs.csv carries run.json's own numbers.
    assert float(row["samples_per_second"]) == pytest.approx(
        record["samples_per_second"], rel=1e-5)
    assert float(row["compute_ms"]) == pytest.approx(
        1e3 * record["phases"]["compute"]["mean"], rel=1e-5)

  cells = {(r["framework"], r["cell"]): r
           for r in read_csv(out / "results.csv")}
  for (framework, cell), record in records.items():
    row = cells[(framework, cell)]
    assert row["status"] == "ok"
    assert float(row["samples_per_second"]) == pytest.approx(
        record["samples_per_second"], rel=1e-5)
    assert float(row["step_ms"]) == pytest.approx(
        1e3 * record["phases"]["step"]["mean"], rel=1e-5)
    base = records[(framework, "baseline")]
    assert float(row["speedup_vs_baseline"]) == pytest.approx(
        record["samples_per_second"] / base["samples_per_second"], rel=1e-4)
    assert (f"| {cell} | 1/1 | {record['samples_per_second']:.0f} | "
            in report)
  assert cells[("pytorch", "checkpoint=tf_async")]["status"] == "unsupported"
  assert "not supported by pytorch" in report
  assert "## Findings" in report and "## Definitions" in report
  for name in ("throughput.png", "breakdown.png", "efficiency.png"):
    assert (out / name).stat().st_size > 1000

  # The report can be rewritten from what the runs left, unchanged.
  (out / "report.md").unlink()
  again = run_module("overlap_compare", "--report_only",
                     f"--output_dir={out}")
  assert again.returncode == 0, again.stderr[-2000:]
  assert (out / "report.md").read_text() == report


def _stage_ms(values):
  return " / ".join(f"{v:.1f}" for v in values)


def test_pipelines_of_both_frameworks_side_by_side(matrix):
  out, _, report = matrix
  runs = {(r["framework"], r["cell"]): r for r in read_csv(out / "runs.csv")}
  cells = {(r["framework"], r["cell"]): r
           for r in read_csv(out / "results.csv")}
  assert "## Pipelines side by side" in report
  table = report.split("## Pipelines side by side")[1].split("\n## ")[0]
  # The unpipelined cells have no row; the pipelined cell has one, with
  # each framework's columns read from its own run.json.
  assert "| baseline |" not in table
  assert "| checkpoint=tf_async |" not in table
  row = "| pipeline_stages=2 |"
  for framework in ("tensorflow", "pytorch"):
    record = run_record.load_run_record(
        str(out / runs[(framework, "pipeline_stages=2")]["run_dir"]))
    section = record["pipeline"]
    stages = section["per_stage"]
    assert (section["stages"], section["micro_batches"]) == (2, 4)
    assert section["bubble_fraction_theory"] == pytest.approx(1 / 5)
    # Both runtimes time the update apart and count it in stage_compute.
    assert all(0 < s["update_ms"] < s["compute_ms"] for s in stages), stages
    derived = section["sources"]["bubble"].startswith("derived")
    assert derived == (framework == "tensorflow")
    row += (f" 2×4 gpipe | {100 * section['bubble_fraction']:.1f}% (20.0%)"
            f"{', derived' if derived else ''} | "
            f"{_stage_ms(s['compute_ms'] for s in stages)} | "
            f"{_stage_ms(s['update_ms'] for s in stages)} | "
            f"{_stage_ms(s['transfer_ms'] for s in stages)} |")
    csv_row = cells[(framework, "pipeline_stages=2")]
    assert float(csv_row["bubble_fraction"]) == pytest.approx(
        section["bubble_fraction"], rel=1e-5)
    assert [float(v) for v in csv_row["stage_compute_ms"].split(";")] == (
        pytest.approx([s["compute_ms"] for s in stages], rel=1e-5))
    assert cells[(framework, "baseline")]["bubble_fraction"] == ""
  assert row in table, table


def _pid_running_with(argument):
  """The pid of a process whose command line holds `argument`, or None."""
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().decode(errors="replace").split("\0")
    except OSError:
      continue
    if argument in args:
      return int(pid)
  return None


def test_a_killed_run_is_a_failed_cell_and_the_rest_go_on(tmp_path):
  out = tmp_path / "report"
  compare = subprocess.Popen(
      [sys.executable, "-m", "overlap_compare", "--matrix=prefetch=0,2",
       "--frameworks=tensorflow", "--repeats=1", f"--output_dir={out}",
       "--", *TINY],
      cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  try:
    # The baseline runs first; kill its trainer as the OOM killer would.
    baseline = f"--model_dir={out}/runs/tensorflow/all/prefetch-0/r1"
    victim = wait_until(lambda: _pid_running_with(baseline),
                        "the baseline's trainer to start", timeout_s=300)
    os.kill(victim, signal.SIGKILL)
    _, stderr = compare.communicate(timeout=600)
  finally:
    if compare.poll() is None:
      compare.kill()
  assert compare.returncode == 1, stderr[-3000:]
  assert "FAILED: was killed by SIGKILL" in stderr
  cells = {r["cell"]: r for r in read_csv(out / "results.csv")}
  assert cells["baseline"]["status"] == "failed"
  assert "SIGKILL" in cells["baseline"]["error"]
  assert cells["prefetch=2"]["status"] == "ok"
  record = run_record.load_run_record(
      str(out / "runs/tensorflow/all/prefetch-2/r1"))
  assert float(cells["prefetch=2"]["samples_per_second"]) == pytest.approx(
      record["samples_per_second"], rel=1e-5)
  assert cells["prefetch=2"]["speedup_vs_baseline"] == ""
  report = (out / "report.md").read_text()
  assert "The baseline did not run" in report
  assert "1 of 1 runs failed" in report


@pytest.mark.parametrize("args, says", [
    (["--matrix=prefech=0,2"], "did you mean 'prefetch'"),
    (["--matrix=checkpoint=none,asink"],
     "cell [checkpoint=asink]: flag --checkpoint=asink"),
    (["--matrix=prefetch=0,2", "--prefetch=2"], "--prefetch is a trainer flag"),
    (["--matrix=prefetch=0,2", "--", "--prefetch=4"], "is also an axis"),
    (["--matrix=prefetch=0;checkpoint=sync,async"], "at least 2"),
    (["--matrix=prefetch=0,2", "--frameworks=jax"], "'jax' is not a "
     "framework"),
    (["--matrix=prefetch=0,2", "--frameworks=pytorch,pytorch"],
     "names 'pytorch' twice"),
    (["--matrix=strategy=default,mirrored", "--", "--batch_size=33"],
     "must divide evenly over 2 replicas"),
])
def test_bad_specs_exit_2_with_one_line_before_any_run(tmp_path, args, says):
  result = run_module("overlap_compare", f"--output_dir={tmp_path}/r",
                      *args, timeout=120)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "error:" in lines[0], result.stderr
  assert says in lines[0]
  assert not os.path.exists(tmp_path / "r")  # nothing ran


def test_an_output_dir_that_holds_runs_is_refused(tmp_path):
  # Its trainers would resume from the checkpoints there, not measure.
  (tmp_path / "runs" / "tensorflow").mkdir(parents=True)
  result = run_module("overlap_compare", "--matrix=prefetch=0,2",
                      f"--output_dir={tmp_path}", timeout=120)
  assert result.returncode == 2
  assert "already holds runs" in result.stderr
  assert os.listdir(tmp_path) == ["runs"]


def test_autotune_picks_a_cell_that_meets_the_constraint(tmp_path):
  out = tmp_path / "tune"
  # Without checkpoints a cell breaks "a checkpoint at least every 600 s",
  # whatever its speed: the search must pick checkpoint=sync.
  result = run_module(
      "overlap_compare", "--autotune", "--matrix=checkpoint=none,sync",
      "--frameworks=tensorflow", "--repeats=1", "--autotune_min_steps=6",
      "--max_checkpoint_interval_s=600", f"--output_dir={out}", "--", *TINY,
      timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  summary = (out / "autotune.md").read_text()
  assert "**Winner: checkpoint=sync**" in summary
  assert "breaks no checkpoints" in summary
  trials = read_csv(out / "autotune.csv")
  assert [(t["train_steps"], t["cell"]) for t in trials] == [
      ("6", "baseline"), ("6", "checkpoint=sync"), ("12", "checkpoint=sync")]
  flagfile = out / "best_tensorflow.flags"
  lines = flagfile.read_text().splitlines()
  assert "--checkpoint=sync" in lines and "--model=mlp" in lines
  assert not any(l.startswith("--model_dir") for l in lines)

  # The trainer takes the winning settings as they are.
  run_dir = tmp_path / "winner"
  trained = run_module("tfoverlap.train", f"--flagfile={flagfile}",
                       f"--model_dir={run_dir}", "--progress=false",
                       "--evaluate=false")
  assert trained.returncode == 0, trained.stderr[-3000:]
  record = run_record.load_run_record(str(run_dir))
  assert record["flags"]["checkpoint"]["mode"] == "sync"
  assert record["flags"]["data"]["image_size"] == 8
  assert record["steps"] == 12
