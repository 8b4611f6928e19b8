"""The comparison matrix spec, its cells and errors, and the plan's run order."""

import pytest

from overlap_compare import plan as compare_plan
from overlap_compare import matrix
from overlap_compare import trainer_runs
from overlap_compare.matrix import Cell, Matrix, MatrixSpecError

from tests.helpers import one_line_error

KNOWN = ("prefetch", "checkpoint", "checkpoint_every", "strategy", "model_dir",
         "preprocess_cost_ms")


def test_axes_cells_labels_and_flags():
  axes = matrix.parse_axes(
      " prefetch = 0, 2 ;checkpoint=sync,async; strategy=default,mirrored")
  assert [a.keys for a in axes] == [("prefetch",), ("checkpoint",),
                                    ("strategy",)]
  assert axes[0].settings == (("0",), ("2",))
  m = Matrix(axes)
  cells = m.cells()
  assert len(cells) == 8
  assert cells[0] == Cell((0, 0, 0)) and cells[0].is_baseline
  assert m.label(cells[0]) == "baseline"
  both = Cell((1, 1, 0))
  assert m.label(both) == "prefetch=2 + checkpoint=async"
  assert m.full_label(both) == ("prefetch=2, checkpoint=async, "
                                "strategy=default")
  assert m.flag_args(both) == ["--prefetch=2", "--checkpoint=async",
                               "--strategy=default"]
  assert both.optimizations == (0, 1)
  assert both.without(0) == Cell((0, 1, 0))
  assert len({m.slug(c) for c in cells}) == 8  # one directory per cell
  assert [len(c.optimizations) for c in cells].count(1) == 3


def test_joined_flags_move_together():
  (axis,) = matrix.parse_axes(
      "checkpoint+checkpoint_every=sync+20,async+20,async+auto")
  assert axis.keys == ("checkpoint", "checkpoint_every")
  assert axis.settings[2] == ("async", "auto")
  assert axis.describe(2) == "checkpoint+checkpoint_every=async+auto"
  assert axis.flag_args(1) == ["--checkpoint=async", "--checkpoint_every=20"]
  assert len(Matrix([axis]).cells()) == 3


def test_workloads_allow_one_setting_and_empty():
  assert matrix.parse_axes("", min_settings=1) == []
  (axis,) = matrix.parse_axes("preprocess_cost_ms=1", min_settings=1)
  assert axis.settings == (("1",),)
  assert Matrix([]).cells() == [Cell(())]


@pytest.mark.parametrize("spec, says", [
    ("", "is empty"),
    ("prefetch=0,2;", "empty axis"),
    ("prefetch", "exactly one '='"),
    ("prefetch=0=2", "exactly one '='"),
    ("pre fetch=0,2", "is not a flag name"),
    ("prefetch=0,", "empty value"),
    ("prefetch=0,2,0", "repeats setting '0'"),
    ("prefetch=0", "at least 2"),
    ("prefetch=0,2;prefetch=4,8", "appears in two axes"),
    ("checkpoint+checkpoint_every=sync,async+5", "1 value(s) for 2 flag(s)"),
    ("checkpoint+checkpoint=sync+sync,async+async", "names a flag twice"),
])
def test_malformed_specs_say_what_is_wrong(spec, says):
  message = one_line_error(matrix.parse_axes, spec, error=MatrixSpecError)
  assert says in message and "--matrix" in message


def test_flag_names_are_checked_against_the_trainers():
  axes = matrix.parse_axes("prefetch=0,2;checkpoint=sync,async")
  matrix.check_flag_names(axes, KNOWN)  # all real: no error
  with pytest.raises(MatrixSpecError, match="did you mean 'prefetch'"):
    matrix.check_flag_names(matrix.parse_axes("prefech=0,2"), KNOWN)
  with pytest.raises(MatrixSpecError, match="'bogus' is not a trainer flag"):
    matrix.check_flag_names(matrix.parse_axes("bogus=0,2"), KNOWN)
  with pytest.raises(MatrixSpecError, match="cannot vary"):
    matrix.check_flag_names(matrix.parse_axes("model_dir=a,b"), KNOWN)


def test_real_flag_surface_names_every_axis_of_the_showcase():
  import flags as tfo_flags  # pylint: disable=g-import-not-at-top
  tfo_flags.define_flags()
  known = [n for names in tfo_flags.flag_names().values() for n in names]
  axes = matrix.parse_axes("prefetch=0,2;checkpoint=sync,async;"
                           "strategy=default,mirrored")
  axes += matrix.parse_axes("preprocess_cost_ms=0,1;checkpoint_every=10",
                            min_settings=1)
  matrix.check_flag_names(axes, known)


def test_plan_schedule_runs_every_cell_once_per_repeat_rotated():
  plan = compare_plan.Plan(
      matrix_spec="prefetch=0,2;checkpoint=sync,async",
      workloads_spec="preprocess_cost_ms=0,1",
      frameworks=["tensorflow", "pytorch"], repeats=3,
      trainer_args=["--model=mlp"])
  schedule = plan.schedule()
  assert len(schedule) == 4 * 2 * 2 * 3
  points = {(f, w, c) for _, f, w, c in schedule}
  assert len(points) == 16
  for repeat in (1, 2, 3):
    in_repeat = [(f, w, c) for r, f, w, c in schedule if r == repeat]
    assert sorted(in_repeat) == sorted(points)
  firsts = [next(p for p in schedule if p[0] == r)[1:] for r in (1, 2, 3)]
  assert len(set(firsts)) == 3  # each repeat starts somewhere else
  _, _, workload, cell = schedule[0]
  assert plan.run_args(workload, cell) == [
      "--model=mlp", "--preprocess_cost_ms=0", "--prefetch=0",
      "--checkpoint=sync"]
  assert compare_plan.Plan.from_json(plan.to_json()).schedule() == schedule


def test_trainer_commands_and_the_launcher_for_several_workers():
  trainers = trainer_runs.parse_trainers(trainer_runs.DEFAULT_TRAINERS)
  assert sorted(trainers) == ["pytorch", "tensorflow"]
  command = trainer_runs.build_command(trainers["pytorch"], ["--prefetch=2"],
                                       "out/r1")
  assert command[1:3] == ["-m", "torch_parity.train"]
  assert command[-2:] == ["--prefetch=2", "--model_dir=out/r1"]
  # Quiet outputs come first, so the user's own flags override them.
  assert command.index("--progress=false") < command.index("--prefetch=2")
  launched = trainer_runs.build_command(
      trainers["tensorflow"], ["--num_workers=2", "--prefetch=2"], "out/r1")
  assert launched[1:5] == ["-m", "tfoverlap.launch", "--num_workers=2", "--"]
  assert not any(a.startswith("--num_workers") for a in launched[5:])


def test_a_third_trainer_is_one_more_entry_not_new_code():
  trainers = trainer_runs.parse_trainers(
      trainer_runs.DEFAULT_TRAINERS + ",jax=jax_side.train:jax_side.launch")
  assert trainer_runs.build_command(trainers["jax"], [], "out")[1:3] == [
      "-m", "jax_side.train"]
  with pytest.raises(ValueError, match="'jax=jax_side.train'"):
    trainer_runs.parse_trainers("jax=jax_side.train")
  with pytest.raises(ValueError, match="twice"):
    trainer_runs.parse_trainers("a=x:y,a=x:z")


def test_pipeline_axes_cross_other_axes_and_one_stage_drops_their_flags():
  from overlap_compare import cli  # pylint: disable=g-import-not-at-top
  plan = compare_plan.Plan(
      matrix_spec=("pipeline_stages=1,2;pipeline_microbatches=2,4;"
                   "pipeline_schedule=gpipe,1f1b"),
      workloads_spec="", frameworks=["pytorch"], repeats=1,
      trainer_args=["--model=small_cnn", "--pipeline_split=even",
                    "--batch_size=16"])
  cells = plan.matrix.cells()
  assert len(cells) == 8
  baseline = cells[0]
  # One stage: micro-batches, schedule and split mean nothing, and the
  # trainers refuse them, so the cell runs without them.
  assert plan.run_args(Cell(()), baseline) == ["--model=small_cnn",
                                               "--batch_size=16",
                                               "--pipeline_stages=1"]
  # ... and the one-stage cells that differ only in them are that run
  # again: not run twice.
  twins = [c for c in cells if plan.same_run_as(Cell(()), c) is not None]
  assert twins == [Cell((0, 0, 1)), Cell((0, 1, 0)), Cell((0, 1, 1))]
  assert all(plan.same_run_as(Cell(()), c) == baseline for c in twins)
  scheduled = [c for _, _, _, c in plan.schedule()]
  assert sorted(scheduled) == [baseline] + [c for c in cells if c.choices[0]]
  piped = Cell((1, 1, 1))
  assert plan.run_args(Cell(()), piped) == [
      "--model=small_cnn", "--pipeline_split=even", "--batch_size=16",
      "--pipeline_stages=2", "--pipeline_microbatches=4",
      "--pipeline_schedule=1f1b"]
  # Every cell passes the trainers' own flag validation, as the command
  # checks before running anything; the flags kept at one stage would not.
  trainers = trainer_runs.parse_trainers(trainer_runs.DEFAULT_TRAINERS)
  cli.validate_plan(plan, trainers)
  with pytest.raises(Exception, match="pipeline_split=even: applies only"):
    cli.check_trainer_args(["--pipeline_split=even", "--pipeline_stages=1"])
  # A pipeline cell on the default two mirrored devices: the trainer starts
  # its two stage processes itself; with --num_workers, the launcher does.
  command = trainer_runs.build_command(
      trainers["pytorch"], plan.run_args(Cell(()), piped), "out/r1")
  assert command[1:3] == ["-m", "torch_parity.train"]
  launched = trainer_runs.build_command(
      trainers["pytorch"], ["--strategy=multi_worker", "--num_workers=4",
                            *plan.run_args(Cell(()), piped)], "out/r1")
  assert launched[1:5] == ["-m", "torch_parity.launch", "--num_workers=4",
                           "--"]


def test_a_pipelined_runs_compute_is_its_three_phases():
  from overlap_compare import metrics  # pylint: disable=g-import-not-at-top
  record = {"samples_per_second": 100.0, "phases": {
      "step": {"mean": 0.010}, "data_wait": {"mean": 0.001},
      "compute": {"mean": 0.0}, "stage_compute": {"mean": 0.005},
      "bubble": {"mean": 0.002}, "transfer": {"mean": 0.001},
      "checkpoint_stall": {"mean": 0.0}, "other": {"mean": 0.001}}}
  stats = metrics.summarize_records([record])
  assert stats.phases_s["compute"] == pytest.approx(0.008)
  assert sum(stats.phases_s.values()) == pytest.approx(stats.step_s)


def test_a_cell_no_framework_combines_is_refused_before_any_run():
  from overlap_compare import cli  # pylint: disable=g-import-not-at-top
  trainers = trainer_runs.parse_trainers(trainer_runs.DEFAULT_TRAINERS)
  # More than one worker needs a multi-worker strategy in both frameworks
  # (a row of the compatibility table, no longer a refusal of the flags).
  plan = compare_plan.Plan(
      matrix_spec="strategy=default,multi_worker", workloads_spec="",
      frameworks=["tensorflow", "pytorch"], repeats=1,
      trainer_args=["--num_workers=2"])
  with pytest.raises(MatrixSpecError) as raised:
    cli.validate_plan(plan, trainers)
  assert ("cell [strategy=default]: --num_workers=2: more than 1 worker "
          "needs --strategy=multi_worker or horovod") in str(raised.value)
  # A cell only PyTorch refuses still runs: the report says "not supported
  # by pytorch" from the trainer's own refusal.
  plan = compare_plan.Plan(
      matrix_spec="checkpoint=sync,tf_async", workloads_spec="",
      frameworks=["tensorflow", "pytorch"], repeats=1, trainer_args=[])
  cli.validate_plan(plan, trainers)
