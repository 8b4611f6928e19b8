"""Human-readable summaries of a run: the end-of-run breakdown table."""

from overlap_core.runtime import contention_split
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import replica_phases
from overlap_core.runtime import verdict as verdict_lib

# offload under compute: it is the part of compute offload added.
_ROW_ORDER = (ledger_lib.DATA_WAIT, ledger_lib.COMPUTE,
              ledger_lib.CONTENTION, ledger_lib.OFFLOAD,
              ledger_lib.EXPOSED_COMM,
              ledger_lib.CHECKPOINT_STALL,
              ledger_lib.OTHER, ledger_lib.STEP)


def format_breakdown(summary: dict, *, title: str = "Per-step breakdown",
                     phases_measured=None, phases_derived=()) -> str:
  """A fixed-width table: per phase mean/p50/p95 in ms and share of step.

  Args:
    summary: `StepLedger.summary()` or a run.json's fields of the same names.
    title: first line of the table.
    phases_measured: phases the trainer could time separately; others show
      "n/a" rather than a misleading zero (Keras fit times data inside its
      compiled step, for instance).
    phases_derived: phases derived rather than timed each step
      (TensorFlow's exposed all-reduce); their rows say "(derived)".
  """
  phases = summary["phases"]
  names = [n for n in _ROW_ORDER if n in phases]
  names += sorted(set(phases) - set(names))
  lines = [
      f"{title} ({summary['measured_steps']} steps after "
      f"{summary['warmup_steps']} warm-up; "
      f"{summary['samples_per_second']:.1f} samples/s)",
      f"  {'phase':<18}{'mean ms':>10}{'p50 ms':>10}{'p95 ms':>10}"
      f"{'share':>8}",
  ]
  for name in names:
    stats = phases[name]
    if (phases_measured is not None and name in ledger_lib.PHASES and
        name not in phases_measured):
      lines.append(f"  {name:<18}{'n/a':>10}{'n/a':>10}{'n/a':>10}{'n/a':>8}")
      continue
    lines.append(f"  {name:<18}{stats['mean'] * 1e3:>10.3f}"
                 f"{stats['p50'] * 1e3:>10.3f}{stats['p95'] * 1e3:>10.3f}"
                 f"{stats['fraction'] * 100:>7.1f}%"
                 + ("  (derived)" if name in phases_derived else ""))
  verdict = verdict_lib.step_verdict(phases, phases_measured)
  lines.append(f"  verdict: {verdict.describe()}")
  understated = contention_split.understated_note(
      summary.get("against_step_alone"))
  if understated:
    lines.append(f"  note: {understated}")
  for note in replica_phases.hidden_all_reduce_notes(
      phases, summary.get("strategy", {})):
    lines.append(f"  note: {note}")
  return "\n".join(lines)


def format_final(record: dict) -> str:
  """The last lines of a run: model, final metrics, where run.json is."""
  final = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in record["final"].items())
  return (f"{record['model']['name']} ({record['model']['num_params']:,} "
          f"params): {final}\nrun record: {record['outputs']['run_record']}")
