"""The ledger fidelity table: each phase against what its removal saved.

Registered into `render_tables.TABLES` on import, like the tables there.
Every figure is read from a results file of `python -m
benchmarks.ledger_fidelity`, one table per file (`RESULTS` says what
each holds).
"""

import functools

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
