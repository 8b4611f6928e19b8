"""Successive halving, the constraints and the flagfile, with known answers.

The candidates' measurements are hand-made CellStats, so which cells go on
at each rung, and which one wins, is known exactly.
"""

import pytest

from overlap_compare import autotune
from overlap_compare import autotune_report
from overlap_compare.autotune import Constraints, TrialFailed
from overlap_compare.matrix import Matrix, parse_axes
from overlap_compare.metrics import CellStats

MATRIX = Matrix(parse_axes("a=0,1;b=0,1;c=0,1"))


def stats(samples_per_second, *, data_frac=0.0, stall_frac=0.0,
          interval_s=None):
  step_s = 32 / samples_per_second
  return CellStats(
      num_runs=1, samples_per_second=samples_per_second, step_s=step_s,
      phases_s={"data_wait": data_frac * step_s,
                "compute": (1 - data_frac - stall_frac) * step_s,
                "checkpoint_stall": stall_frac * step_s, "other": 0.0},
      step_spread=0.0, runs_samples_per_second=(samples_per_second,),
      checkpoint_interval_s=interval_s)


class Bench:
  """Throughput per cell: 100 + 10 x (the cell's index), whatever the steps."""

  def __init__(self, overrides=None, failing=()):
    self.calls = []
    self.overrides = overrides or {}
    self.failing = failing

  def __call__(self, cell, steps):
    self.calls.append((cell, steps))
    if cell in self.failing:
      raise TrialFailed("exited with status 1: boom")
    if cell in self.overrides:
      return self.overrides[cell]
    return stats(100 + 10 * MATRIX.cells().index(cell))


def test_rung_budgets():
  assert autotune.rung_budgets(10, 40, 2) == [10, 20, 40]
  assert autotune.rung_budgets(10, 50, 2) == [10, 20, 40, 50]
  assert autotune.rung_budgets(30, 30, 3) == [30]
  with pytest.raises(ValueError, match="min_steps"):
    autotune.rung_budgets(0, 10, 2)
  with pytest.raises(ValueError, match="max_steps"):
    autotune.rung_budgets(20, 10, 2)
  with pytest.raises(ValueError, match="eta"):
    autotune.rung_budgets(10, 20, 1)


def test_halving_keeps_the_fastest_half_and_trains_longer():
  bench = Bench()
  cells = MATRIX.cells()
  result = autotune.successive_halving(cells, bench, min_steps=10,
                                       max_steps=40, eta=2,
                                       constraints=Constraints())
  assert [steps for _, steps in bench.calls] == [10] * 8 + [20] * 4 + [40] * 2
  assert [c for c, s in bench.calls if s == 20] == cells[7:3:-1]
  assert result.winner == cells[7]
  assert result.winner_stats.samples_per_second == 170
  verdicts = autotune_report.trial_verdicts(result)
  assert verdicts[(0, cells[0])] == "dropped: slower"
  assert verdicts[(0, cells[7])] == "kept"
  assert verdicts[(2, cells[7])] == "winner"


def test_constraints_drop_the_fastest_cells_that_break_them():
  cells = MATRIX.cells()
  bench = Bench(overrides={
      cells[7]: stats(500, data_frac=0.30),  # fastest, but input-bound
      cells[6]: stats(400, stall_frac=0.20),
  })
  constraints = Constraints(max_data_wait_frac=0.10,
                            max_checkpoint_stall_frac=0.05)
  result = autotune.successive_halving(cells, bench, min_steps=10,
                                       max_steps=40, eta=2,
                                       constraints=constraints)
  assert result.winner == cells[5]
  verdicts = autotune_report.trial_verdicts(result)
  assert verdicts[(0, cells[7])] == "breaks data wait 30.0% > 10%"
  assert verdicts[(0, cells[6])] == "breaks checkpoint stall 20.0% > 5%"


def test_checkpoint_interval_constraint():
  constraints = Constraints(max_checkpoint_interval_s=5)
  assert constraints.violations(stats(100, interval_s=4.0)) == ()
  assert constraints.violations(stats(100, interval_s=6.0)) == (
      "a checkpoint every 6.00 s > 5 s",)
  assert constraints.violations(stats(100)) == ("no checkpoints",)
  assert "a checkpoint at least every 5 s" in constraints.describe()
  with pytest.raises(ValueError, match="max_checkpoint_interval_s"):
    Constraints(max_checkpoint_interval_s=0)
  with pytest.raises(ValueError, match="max_data_wait_frac"):
    Constraints(max_data_wait_frac=1.5)


def test_a_lone_survivor_goes_straight_to_the_full_budget():
  cells = MATRIX.cells()[:3]
  bench = Bench(failing={cells[0]})
  result = autotune.successive_halving(cells, bench, min_steps=10,
                                       max_steps=90, eta=3,
                                       constraints=Constraints())
  assert bench.calls == [(cells[0], 10), (cells[1], 10), (cells[2], 10),
                         (cells[2], 90)]
  assert result.winner == cells[2]
  verdicts = autotune_report.trial_verdicts(result)
  assert verdicts[(0, cells[0])] == "failed: exited with status 1: boom"


def test_no_feasible_cell_means_no_winner():
  bench = Bench()
  result = autotune.successive_halving(
      MATRIX.cells()[:2], bench, min_steps=10, max_steps=20, eta=2,
      constraints=Constraints(max_checkpoint_interval_s=1))
  assert result.winner is None
  assert len(bench.calls) == 2  # nothing went on to the next rung


def test_flagfile_format_and_report():
  text = autotune.format_flagfile(["--prefetch=2", "--checkpoint=async"],
                                  ["first", "second"])
  assert text == "# first\n# second\n--prefetch=2\n--checkpoint=async\n"
  result = autotune.successive_halving(MATRIX.cells(), Bench(), min_steps=10,
                                       max_steps=20, eta=2,
                                       constraints=Constraints())
  md = autotune_report.format_markdown(
      [("tensorflow", result, "best_tensorflow.flags")], MATRIX.label,
      Constraints(), header=[("date", "today")])
  assert "**Winner: a=1 + b=1 + c=1**, 170 samples/s at 20 steps" in md
  assert "Steps trained: 160 per repeat, against 160" in md
  csv_text = autotune_report.format_csv([("tensorflow", result, "")],
                                        MATRIX.label)
  assert csv_text.splitlines()[0].split(",") == list(
      autotune_report.CSV_HEADERS)
  assert len(csv_text.splitlines()) == 1 + 8 + 4
