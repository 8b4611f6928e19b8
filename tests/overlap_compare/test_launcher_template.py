"""The comparison's launcher template: how a cell runs through srun or a
multi-host torchrun. Expanded here without a cluster."""

import sys

import pytest

from overlap_compare import trainer_runs
from overlap_compare.launcher import LauncherTemplate

from tests.helpers import one_line_error, run_module


def _trainers(template: str) -> dict:
  parsed = LauncherTemplate.parse(template)
  return {name: trainer_runs.Trainer(t.framework, t.train_module,
                                     t.launch_module, launcher=parsed)
          for name, t in trainer_runs.parse_trainers(
              trainer_runs.DEFAULT_TRAINERS).items()}


def test_srun_wraps_the_whole_trainer_command():
  trainers = _trainers("srun -N2 --ntasks-per-node=1 {command}")
  command = trainer_runs.build_command(
      trainers["tensorflow"],
      ["--strategy=multi_worker", "--num_workers=2", "--prefetch=2"],
      "out/r1")
  assert command[:6] == ["srun", "-N2", "--ntasks-per-node=1",
                         sys.executable, "-m", "tfoverlap.train"]
  # The scheduler starts the workers: no local launcher, and the flags,
  # --num_workers included, reach every trainer as given.
  assert "tfoverlap.launch" not in command
  assert command[-3:] == ["--num_workers=2", "--prefetch=2",
                          "--model_dir=out/r1"]
  assert "--progress=false" in command


def test_flags_alone_go_where_the_template_says():
  trainers = _trainers(
      "torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d "
      "--rdzv_endpoint='node01:29400' --rdzv_id={framework}-run "
      "-m {module} {flags}")
  command = trainer_runs.build_command(trainers["pytorch"], ["--prefetch=2"],
                                       "out dir/r1")
  assert command[:7] == ["torchrun", "--nnodes=2", "--nproc_per_node=1",
                         "--rdzv_backend=c10d", "--rdzv_endpoint=node01:29400",
                         "--rdzv_id=pytorch-run", "-m"]
  assert command[7] == "torch_parity.train"
  assert command[-1] == "--model_dir=out dir/r1"  # one word, spaces kept


def test_scalar_placeholders_fill_inside_words():
  template = LauncherTemplate.parse(
      "sh -c 'cd {model_dir} && exec \"$@\"' x {python} -m {module} {flags}")
  argv = template.expand(python="py", module="m.train", framework="f",
                         flags=["--a=1"], model_dir="d")
  assert argv == ["sh", "-c", "cd d && exec \"$@\"", "x", "py", "-m",
                  "m.train", "--a=1"]


@pytest.mark.parametrize("template, said", [
    ("srun -N2", "neither {command} nor {flags}"),
    ("srun {comand}", "unknown placeholder {comand}"),
    ("srun --x={command}", "{command} must be a word of its own"),
    ("srun 'unclosed {command}", "No closing quotation"),
    ("srun {command!r}", "formats a placeholder"),
])
def test_a_bad_template_is_refused_in_one_line(template, said):
  message = one_line_error(LauncherTemplate.parse, template)
  assert said in message and "`launcher`" in message


def test_the_command_refuses_a_bad_template_before_any_run(tmp_path):
  result = run_module("overlap_compare", "--launcher=srun -N2",
                      "--matrix=prefetch=0,2", "--frameworks=tensorflow",
                      f"--output_dir={tmp_path}", "--", "--model=mlp",
                      timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "neither {command} nor {flags}" in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "runs").exists()


def test_every_run_goes_through_the_launcher(tmp_path):
  out = tmp_path / "report"
  # A launcher that leaves a mark in the run's directory, then runs the
  # trainer command it was given, as srun would on a node.
  launcher = ("sh -c 'touch \"$0\"/launched-by-template && exec \"$@\"' "
              "{model_dir} {command}")
  result = run_module(
      "overlap_compare", f"--launcher={launcher}", "--matrix=prefetch=0,2",
      "--frameworks=tensorflow", "--repeats=1", f"--output_dir={out}", "--",
      "--model=mlp", "--dataset=synthetic", "--image_size=8",
      "--batch_size=16", "--strategy=default", "--train_steps=4",
      timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  marks = sorted(out.glob("runs/**/launched-by-template"))
  assert len(marks) == 2
  for mark in marks:
    assert (mark.parent / "run.json").exists()
