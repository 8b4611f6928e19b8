"""The ledger fidelity benchmark's cells and verdicts, without a run."""

from benchmarks import harness
from benchmarks import ledger_fidelity


def _runs(side, step_ms_by_repeat, phase_ms, contention_ms=0.0):
  return [{"side": list(side), "repeat": r, "step_ms": s, "phase_ms": phase_ms,
           "contention_ms": contention_ms}
          for r, s in enumerate(step_ms_by_repeat)]


def test_a_phase_its_removal_saves_meets_and_one_it_does_not_misses():
  job = ("pytorch", "default", "data_wait", ledger_fidelity.JOB)
  removed = job[:3] + (ledger_fidelity.REMOVED,)
  # Removing the input saves 5 ms in every repeat; the ledger said 5.1.
  payload = {"runs": _runs(job, [20.0] * 5, 5.1)
                     + _runs(removed, [15.0] * 5, 0.0)}
  (cell,) = ledger_fidelity.summarize(payload)
  assert cell["saving_ms"] == 5.0 and cell["phase_ms"] == 5.1
  assert cell["target_verdict"] == harness.MET
  # The ledger said 2 ms where the removal saved 5: 3 ms off, well beyond
  # max(10% of 5, 0.3) ms.
  payload = {"runs": _runs(job, [20.0] * 5, 2.0)
                     + _runs(removed, [15.0] * 5, 0.0)}
  (cell,) = ledger_fidelity.summarize(payload)
  assert cell["rest_of_increase_ms"] == 3.0
  assert cell["target_verdict"] == harness.MISSED


def test_pairing_noise_around_the_saving_is_noisy_not_missed():
  job = ("pytorch", "default", "checkpoint_stall", ledger_fidelity.JOB)
  removed = job[:3] + (ledger_fidelity.REMOVED,)
  # The ledger says 5 ms each time; the pairs' savings scatter 1 ms
  # either side of it, twice the tolerance (0.5 ms) in every pair. The
  # median miss is 0, but 5 repeats give no interval that narrow.
  payload = {"runs": _runs(job, [20.0, 21.0, 19.0, 19.0, 21.0], 5.0)
                     + _runs(removed, [15.0] * 5, 0.0)}
  (cell,) = ledger_fidelity.summarize(payload)
  assert cell["signed_miss_over_tolerance_all"] == [0.0, -2.0, 2.0, 2.0,
                                                    -2.0]
  assert cell["miss_over_tolerance_all"] == [0.0, 2.0, 2.0, 2.0, 2.0]
  assert cell["target"]["median"] == 0.0
  assert cell["target_verdict"] == harness.NOISY


def test_verdict_within_is_two_sided():
  def within(low, high):
    return harness.verdict_within({"low": low, "high": high}, 1.0)
  assert within(-0.9, 0.8) == harness.MET
  assert within(-1.2, 0.8) == harness.NOISY
  assert within(1.1, 3.0) == harness.MISSED
  assert within(-3.0, -1.1) == harness.MISSED
  assert within(None, None) == harness.NOISY


def test_the_contention_the_cause_made_counts_with_its_phase():
  job = ("tensorflow", "default", "data_wait", ledger_fidelity.JOB)
  removed = job[:3] + (ledger_fidelity.REMOVED,)
  # 1 ms waited and 4 ms of compute slowed by the input beside the step
  # (the resident job keeps 0.5 ms of its own): 4.5 ms attributed
  # against 4.6 saved.
  payload = {"runs": _runs(job, [20.0] * 5, 1.0, contention_ms=4.0)
                     + _runs(removed, [15.4] * 5, 0.0, contention_ms=0.5)}
  (cell,) = ledger_fidelity.summarize(payload)
  assert cell["phase_ms"] == 1.0
  assert cell["attributed_ms"] == 4.5
  assert cell["saving_ms"] == 4.6
  assert cell["target_verdict"] == harness.MET


def test_every_cell_but_data_wait_keeps_its_batches_resident():
  for phase, removal in ledger_fidelity.PHASES.items():
    resident = "--synthetic_on_device" in removal.job
    assert resident == (phase != "data_wait"), phase


def test_cells_cover_each_phases_strategies():
  class Args:
    frameworks = ledger_fidelity.FRAMEWORKS
    strategies = ledger_fidelity.STRATEGIES
    phases = tuple(ledger_fidelity.PHASES)
    two_runs = False
    cells = ()
  cells = ledger_fidelity.cells(Args)
  assert ("tensorflow", "mirrored", "data_wait") in cells
  assert ("pytorch", "mirrored", "checkpoint_stall") in cells
  # Offload is checked under the default strategy only.
  assert ("pytorch", "mirrored", "offload") not in cells
  assert ("pytorch", "default", "offload") in cells
  # The all-reduce is removed under the mirrored strategy, in one run in
  # both frameworks; as two runs in PyTorch's DDP only, TensorFlow
  # refusing --all_reduce=off.
  assert ("pytorch", "mirrored", "exposed_comm") in cells
  assert ("tensorflow", "mirrored", "exposed_comm") in cells
  assert ("pytorch", "default", "exposed_comm") not in cells
  # The bubble under the mirrored strategy, whose devices are the stages.
  assert ("tensorflow", "mirrored", "bubble") in cells
  assert ("pytorch", "mirrored", "bubble") in cells
  Args.two_runs = True
  cells = ledger_fidelity.cells(Args)
  assert ("pytorch", "mirrored", "exposed_comm") in cells
  assert ("tensorflow", "mirrored", "exposed_comm") not in cells
  # --cells picks among them; a cell the selection has not is not run.
  Args.two_runs = False
  Args.cells = (("tensorflow", "mirrored", "data_wait"),
                ("tensorflow", "default", "exposed_comm"))
  assert ledger_fidelity.cells(Args) == [
      ("tensorflow", "mirrored", "data_wait")]


def test_a_run_that_holds_both_sides_is_a_pair_of_its_halves():
  side = ("tensorflow", "mirrored", "checkpoint_stall",
          ledger_fidelity.IN_RUN)

  def half(step_ms, stall_ms, contention_ms):
    return {"step_ms": step_ms, "phase_ms": stall_ms,
            "contention_ms": contention_ms}

  # Each run's halves: 4 ms of stall and 0.5 ms more contention with the
  # saves, against a step 4.4 to 4.6 ms longer.
  payload = {"runs": [
      {"side": list(side), "repeat": r,
       "halves": {ledger_fidelity.JOB: half(step_ms, 4.0, 0.7),
                  ledger_fidelity.REMOVED: half(15.0, 0.0, 0.2)}}
      for r, step_ms in enumerate([19.4, 19.5, 19.6, 19.5, 19.5])]}
  (cell,) = ledger_fidelity.summarize(payload)
  assert cell["pairing"] == "in one run"
  assert cell["saving_ms"] == 4.5 and cell["attributed_ms"] == 4.5
  assert cell["target_verdict"] == harness.MET


def test_the_causes_the_trainer_alternates_run_in_one_run_unless_asked():
  class Args:
    quick = False
    two_runs = False
    train_steps = 100
    model, image_size, batch_size = "cnn", 32, 64

  side = ("pytorch", "default", "data_wait", ledger_fidelity.IN_RUN)
  assert ledger_fidelity.variants(Args, "data_wait") == (
      ledger_fidelity.IN_RUN,)
  flags = ledger_fidelity.side_flags(Args, side)
  assert "--paired_removal=input" in flags and "--train_steps=200" in flags
  # A checkpoint cell's runs hold four times the saves.
  flags = ledger_fidelity.side_flags(
      Args, ("pytorch", "mirrored", "checkpoint_stall",
             ledger_fidelity.IN_RUN))
  assert "--paired_removal=checkpoint" in flags
  assert "--train_steps=800" in flags
  side = ("tensorflow", "mirrored", "exposed_comm", ledger_fidelity.IN_RUN)
  assert ledger_fidelity.variants(Args, "exposed_comm") == (
      ledger_fidelity.IN_RUN,)
  flags = ledger_fidelity.side_flags(Args, side)
  assert "--paired_removal=all_reduce" in flags
  # The model whose gradients cross in more than the tolerance's floor.
  assert flags[-4:-2] == ledger_fidelity.COMM_MODEL_FLAGS
  # The pipeline's waits too; TensorFlow's stages are stage servers, each
  # on one thread.
  assert ledger_fidelity.variants(Args, "bubble") == (ledger_fidelity.IN_RUN,)
  side = ("tensorflow", "mirrored", "bubble", ledger_fidelity.IN_RUN)
  flags = ledger_fidelity.side_flags(Args, side)
  assert "--paired_removal=pipeline_waits" in flags
  assert set(ledger_fidelity.TF_STAGE_PROCESSES_FLAGS) <= set(flags)
  assert "--pipeline_runtime=processes" not in ledger_fidelity.side_flags(
      Args, ("pytorch",) + side[1:])
  Args.two_runs = True
  assert ledger_fidelity.variants(Args, "data_wait") == (
      ledger_fidelity.JOB, ledger_fidelity.REMOVED)
  # As two runs, the stages run apart for the whole of the second.
  side = ("tensorflow", "mirrored", "bubble", ledger_fidelity.REMOVED)
  assert ledger_fidelity.side_flags(Args, side)[-1] == (
      "--pipeline_stages_apart")
