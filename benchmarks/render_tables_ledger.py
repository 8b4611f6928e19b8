"""The ledger fidelity table: each phase against what its removal saved.

Registered into `render_tables.TABLES` on import, like the tables there.
Every figure is read from a results file of `python -m
benchmarks.ledger_fidelity`, one table per file (`RESULTS` says what
each holds).
"""

import functools
import statistics

from benchmarks import ledger_fidelity
from benchmarks.render_tables import load, markdown, spread, table


def _removal(runs: list, cell: dict) -> str:
  """The flags a cell's removed side adds to its job, as the runs were
  launched (a phase since renamed keeps its flags); for a cell whose
  cause was removed within one run, the flags that asked for it."""
  flags = {}
  for run in runs:
    framework, strategy, phase, variant = run["side"]
    if (framework, strategy, phase) == (cell["framework"], cell["strategy"],
                                        cell["phase"]):
      flags[variant] = run["flags"]
  if ledger_fidelity.IN_RUN in flags:
    return " ".join(f for f in flags[ledger_fidelity.IN_RUN]
                    if f.startswith("--paired_"))
  job = set(flags[ledger_fidelity.JOB])
  return " ".join(f for f in flags[ledger_fidelity.REMOVED] if f not in job)


# Every fidelity results file and what it holds: the full run, then the
# reruns of some cells, each a block of its own name on page 17.
RESULTS = {
    "": "the full run",
    "_first_batch": "the full run from when the steps without input took "
                    "the run's first batch, repeated",
    "_input_distinct": "the input cells, once the steps without input took "
                       "batches of their own",
    "_input_distinct_r21": "the input cells with batches of their own, at "
                           "21 repeats",
    "_one_bank": "the full run from before each half of a paired run "
                 "carved its contention with a bank of its own, DDP's step "
                 "alone was timed in lockstep and a DDP step's data wait "
                 "became the replicas'",
    "_input_replicas_r21": "the input cells at 21 repeats, once each half "
                           "had a bank of its own, DDP's step alone was "
                           "timed in lockstep and a DDP step's data wait "
                           "was the replicas'",
    "_two_runs": "every cell as two runs, the full run from before the "
                 "trainer could remove a cause within one run",
    "_in_run": "the input and checkpoint cells, each removal within one run",
    "_offload_in_run": "the offload cells, offload paused in alternate "
                       "blocks of one run",
    "_in_run_pytorch_r21": "PyTorch's input and checkpoint cells in one "
                           "run, at 21 repeats",
    "_in_run_tensorflow_checkpoint_r21": "TensorFlow's checkpoint cells in "
                                         "one run, at 21 repeats",
    "_bubble": "the bubble cell: a pipeline against its stages run apart",
    "_bubble_in_turn": "the bubble cell again, once the stages were timed "
                       "alone one rank at a time",
    "_exposed_comm": "the exposed_comm cell again, once DDP's step alone was "
                     "timed with its all-reduce paused",
    "_offload": "the offload cells again, once the phase was derived from "
                "the step timed alone with and without offload",
    "_two_run_comm": "the full run from before the exposed_comm cells were "
                     "paired within one run",
    "_bubble_tensorflow": "TensorFlow's bubble cell: its stage servers "
                          "against their stages run apart",
    "_bubble_tensorflow_alone": "TensorFlow's bubble cell again, once each "
                                "stage was timed alone, one at a time, for "
                                "the contention phase",
    "_noisy_cells_r41": "the four cells the full run left noisy, at 41 "
                        "repeats, once contention's balance was settled at "
                        "the loop's end",
    "_ddp_checkpoint_r81": "PyTorch's DDP checkpoint cell, the one of those "
                           "four left noisy, at 81 repeats",
    "_bubble_in_run_r21": "both bubble cells, the stages run apart in "
                          "alternate blocks of one run",
    "_ddp_checkpoint_s400_r41": "PyTorch's DDP checkpoint cell at 41 "
                                "repeats, its runs four times as long",
    "_bubble_two_runs": "the full run from before the bubble cells were "
                        "paired within one run and the checkpoint cells "
                        "ran four times the steps",
    "_ddp_input_r41": "PyTorch's DDP input cell, which the full run left "
                      "leaning over, at 41 repeats",
    "_ddp_input_over_replicas_r41": "PyTorch's DDP input cell at 41 "
                                    "repeats, once contention was taken "
                                    "over the replicas",
    "_full_over_replicas_r21": "the full run once DDP's replicas took "
                               "contention over the replicas",
    "_input_retimed_r21": "the one-process input cells at 21 repeats, "
                          "once the step alone was timed again after the "
                          "loop",
    "_retimed_15_calls_r15": "every cell but the checkpoint cells at 15 "
                             "repeats, once each timing of the step alone "
                             "took 15 calls",
    "_offload_30_calls_r15": "both offload cells at 15 repeats, once the "
                             "offload's cost took twice the calls each way",
    "_final_r21": "the full run once the step alone was timed again after "
                  "the loop, at 15 calls a timing",
}


def fidelity_table(name: str) -> str:
  """The table of the results file `name` (`ledger_fidelity` + a suffix
  of `RESULTS`)."""
  return _fidelity_table(load(name))


for _suffix in RESULTS:
  _name = ledger_fidelity.NAME + _suffix
  table(_name)(functools.partial(fidelity_table, _name))


def _fidelity_table(data: dict) -> str:
  rows = []
  for cell in data["summary"]:
    removal = _removal(data["runs"], cell)
    # A results file from before the contention phase attributed the
    # saving to the phase alone.
    attributed = cell.get("attributed_ms_all", cell["phase_ms_all"])
    rows.append([
        cell["framework"], f"`{cell['strategy']}`",
        " + ".join(f"`{p}`" for p in cell.get("phases", [cell["phase"]])),
        f"`{removal}`", cell.get("pairing", "two runs"),
        spread(cell["phase_ms_all"]), spread(attributed),
        spread(cell["saving_ms_all"]),
        spread([s - a for a, s in zip(attributed, cell["saving_ms_all"])]),
        spread(cell["signed_miss_over_tolerance_all"]),
        spread(cell["miss_over_tolerance_all"]), cell["target_verdict"]])
  return markdown(
      ["framework", "strategy", "phase", "removed by", "pairs", "phase ms",
       "phase + contention change ms", "saving ms", "saving − attributed ms",
       "(attributed − saving) / tolerance", "per pair |miss| / tolerance",
       "median within tolerance"], rows)


# ---- the step alone against the half without the cause ---------------------
# The in-run input and checkpoint cells, whose reference is the plain step
# timed alone (offload's and the all-reduce's cells split their own way).
_GAP_PHASES = ("data_wait", "checkpoint_stall")


def _step_without_cause_ms(run: dict) -> float:
  """The half without the cause's step as its reference counts it: its
  compute and contention, with TensorFlow's derived exposed all-reduce,
  which the step TensorFlow times alone holds (PyTorch times DDP's step
  with its all-reduce paused)."""
  phases = run["paired_removal"]["halves"]["without"]["phases_ms"]
  held = ["compute", "contention"] + (
      ["exposed_comm"] if run["side"][0] == "tensorflow" else [])
  return sum(phases.get(name, 0.0) for name in held)


def _signed_miss(run: dict, tolerance_ms: float) -> float:
  """(attributed − saving) / tolerance of one run holding both sides."""
  job = run["halves"][ledger_fidelity.JOB]
  removed = run["halves"][ledger_fidelity.REMOVED]
  saving_ms = job["step_ms"] - removed["step_ms"]
  return (ledger_fidelity.attributed_ms(job, removed)
          - saving_ms) / tolerance_ms


def _gap_cells(name: str, timed: str):
  """(cell, runs) for each in-run input and checkpoint cell of the results
  file `name`, with the cell's runs that recorded `timed` (a timing of
  the step alone)."""
  data = load(name)
  for cell in data["summary"]:
    if cell["phase"] not in _GAP_PHASES or cell["pairing"] != "in one run":
      continue
    yield cell, [r for r in data["runs"]
                 if r["side"][:3] == [cell["framework"], cell["strategy"],
                                      cell["phase"]] and r.get(timed)]


def reference_gap_table(name: str) -> str:
  """Per in-run input and checkpoint cell of the results file `name`: the
  runs whose step alone was timed above the step of their half without
  the cause, and the signed miss over tolerance in those runs and in the
  others. A phase cannot be negative, so steps below the reference carve
  no contention: in such a run the half with the cause carves only its
  steps' excess over a reference that is too high."""
  rows = []
  for cell, runs in _gap_cells(name, "reference_ms"):
    gap_ms = [r["reference_ms"] - _step_without_cause_ms(r) for r in runs]
    # The lowest timed call as the reference instead: what the half
    # without the cause would then carve.
    lowest_gap_ms = [min(r["reference_calls_ms"]) - _step_without_cause_ms(r)
                     for r in runs]
    misses = [_signed_miss(r, cell["tolerance_ms"]) for r in runs]
    above = [m for m, gap in zip(misses, gap_ms) if gap > 0]
    below = [m for m, gap in zip(misses, gap_ms) if gap <= 0]
    rows.append([cell["framework"], f"`{cell['strategy']}`",
                 f"`{cell['phase']}`", len(runs), spread(gap_ms),
                 spread(lowest_gap_ms),
                 len(above), spread(above), spread(below)])
  return markdown(
      ["framework", "strategy", "phase", "runs",
       "step alone − step without the cause ms",
       "lowest timed call − step without the cause ms",
       "runs with the step alone above", "(attributed − saving) / "
       "tolerance, those runs", "(attributed − saving) / tolerance, the "
       "others"], rows)


for _name in (ledger_fidelity.NAME, ledger_fidelity.NAME + "_bubble_two_runs",
              ledger_fidelity.NAME + "_noisy_cells_r41",
              ledger_fidelity.NAME + "_ddp_checkpoint_r81",
              ledger_fidelity.NAME + "_ddp_checkpoint_s400_r41",
              ledger_fidelity.NAME + "_ddp_input_r41",
              ledger_fidelity.NAME + "_ddp_input_over_replicas_r41",
              ledger_fidelity.NAME + "_full_over_replicas_r21",
              ledger_fidelity.NAME + "_input_retimed_r21",
              ledger_fidelity.NAME + "_retimed_15_calls_r15",
              ledger_fidelity.NAME + "_final_r21"):
  table(_name + "_reference_gap")(
      functools.partial(reference_gap_table, _name))


def retimed_reference_table(name: str) -> str:
  """Per in-run input and checkpoint cell of the results file `name`, whose
  runs timed the step alone before the loop and again after it: each
  timing's median against the step of the half without the cause, how
  many runs the second timing lowered the reference in, and by how much
  in those runs."""
  rows = []
  for cell, runs in _gap_cells(name, "reference_later_calls_ms"):
    before_ms = [statistics.median(r["reference_calls_ms"]) for r in runs]
    after_ms = [statistics.median(r["reference_later_calls_ms"])
                for r in runs]
    without_ms = [_step_without_cause_ms(r) for r in runs]
    lowered_ms = [b - a for b, a in zip(before_ms, after_ms) if a < b]
    rows.append([cell["framework"], f"`{cell['strategy']}`",
                 f"`{cell['phase']}`", len(runs),
                 spread([b - w for b, w in zip(before_ms, without_ms)]),
                 spread([a - w for a, w in zip(after_ms, without_ms)]),
                 len(lowered_ms), spread(lowered_ms)])
  return markdown(
      ["framework", "strategy", "phase", "runs",
       "timed before the loop − step without the cause ms",
       "timed after the loop − step without the cause ms",
       "runs the second timing lowered", "lowered by ms"], rows)


for _name in (ledger_fidelity.NAME + "_input_retimed_r21",
              ledger_fidelity.NAME + "_retimed_15_calls_r15",
              ledger_fidelity.NAME + "_final_r21"):
  table(_name + "_retimed")(functools.partial(retimed_reference_table, _name))


# ---- DDP's exposed_comm between the halves ----------------------------------
# The cells whose cause is rank 0's own wait: what the attribution leaves
# out is any change in exposed_comm, which the ledger does not count as
# the cause's.
_DDP_WAIT_CELLS = (("pytorch", "mirrored", "data_wait"),
                   ("pytorch", "mirrored", "checkpoint_stall"))


def exposed_comm_change_table(name: str) -> str:
  """Per DDP input and checkpoint cell of the results file `name` that
  holds both halves in one run: how rank 0's exposed_comm and contention
  changed with the cause (with − without), in how many runs exposed_comm
  was shorter with the cause, and how the runs' signed misses follow each
  change (Pearson's correlation over the runs)."""
  data = load(name)
  rows = []
  for cell in data["summary"]:
    key = (cell["framework"], cell["strategy"], cell["phase"])
    if key not in _DDP_WAIT_CELLS or cell["pairing"] != "in one run":
      continue
    runs = [r for r in data["runs"] if tuple(r["side"][:3]) == key]
    change = [r["paired_removal"]["change_ms"] for r in runs]
    comm = [c.get("exposed_comm", 0.0) for c in change]
    contention = [c.get("contention", 0.0) for c in change]
    misses = [_signed_miss(r, cell["tolerance_ms"]) for r in runs]
    rows.append([cell["framework"], f"`{cell['strategy']}`",
                 f"`{cell['phase']}`", len(runs), spread(comm),
                 sum(c < 0 for c in comm), spread(contention),
                 f"{statistics.correlation(misses, comm):.2f}",
                 f"{statistics.correlation(misses, contention):.2f}",
                 f"{statistics.correlation(comm, contention):.2f}"])
  return markdown(
      ["framework", "strategy", "phase", "runs",
       "exposed_comm change ms", "runs with it shorter with the cause",
       "contention change ms", "correlation: miss, exposed_comm change",
       "correlation: miss, contention change",
       "correlation: exposed_comm change, contention change"], rows)


for _name in (ledger_fidelity.NAME,
              ledger_fidelity.NAME + "_full_over_replicas_r21",
              ledger_fidelity.NAME + "_ddp_input_r41",
              ledger_fidelity.NAME + "_ddp_input_over_replicas_r41",
              ledger_fidelity.NAME + "_final_r21"):
  table(_name + "_exposed_comm_change")(
      functools.partial(exposed_comm_change_table, _name))
