"""The ledger fidelity table: each phase against what its removal saved.

Registered into `render_tables.TABLES` on import, like the tables there.
Every figure is read from a results file of `python -m
benchmarks.ledger_fidelity`: `ledger_fidelity.json`, its full run;
`ledger_fidelity_two_runs.json`, the full run from before any cell ran
in one run; and the reruns of some cells, each named after what it
reran (`_offload`, `_bubble`, `_bubble_in_turn`, `_exposed_comm`,
`_in_run`, `_in_run_pytorch_r21`, `_in_run_tensorflow_checkpoint_r21`,
`_offload_in_run`).
"""

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


@table("ledger_fidelity")
def ledger_fidelity_table() -> str:
  return _fidelity_table(load(ledger_fidelity.NAME))


@table("ledger_fidelity_two_runs")
def ledger_fidelity_two_runs_table() -> str:
  """Every cell as two runs, the full run from before the trainer could
  remove a cause within one run."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_two_runs"))


@table("ledger_fidelity_in_run")
def ledger_fidelity_in_run_table() -> str:
  """The input and checkpoint cells, each removal within one run."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_in_run"))


@table("ledger_fidelity_offload_in_run")
def ledger_fidelity_offload_in_run_table() -> str:
  """The offload cells, offload paused in alternate blocks of one run."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_offload_in_run"))


@table("ledger_fidelity_in_run_pytorch_r21")
def ledger_fidelity_in_run_pytorch_r21_table() -> str:
  """PyTorch's input and checkpoint cells in one run, at 21 repeats."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_in_run_pytorch_r21"))


@table("ledger_fidelity_in_run_tensorflow_checkpoint_r21")
def ledger_fidelity_in_run_tensorflow_checkpoint_r21_table() -> str:
  """TensorFlow's checkpoint cells in one run, at 21 repeats."""
  return _fidelity_table(
      load(ledger_fidelity.NAME + "_in_run_tensorflow_checkpoint_r21"))


@table("ledger_fidelity_bubble")
def ledger_fidelity_bubble_table() -> str:
  """The bubble cell: a pipeline against its stages run apart."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_bubble"))


@table("ledger_fidelity_bubble_in_turn")
def ledger_fidelity_bubble_in_turn_table() -> str:
  """The bubble cell again, once the stages were timed alone one rank at
  a time."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_bubble_in_turn"))


@table("ledger_fidelity_exposed_comm")
def ledger_fidelity_exposed_comm_table() -> str:
  """The exposed_comm cell again, once DDP's step alone was timed with its
  all-reduce paused."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_exposed_comm"))


@table("ledger_fidelity_offload")
def ledger_fidelity_offload_table() -> str:
  """The offload cells again, once the phase was derived from the step
  timed alone with and without offload."""
  return _fidelity_table(load(ledger_fidelity.NAME + "_offload"))


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
