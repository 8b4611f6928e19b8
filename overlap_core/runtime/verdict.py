"""What bounds a run's steps, in one word, from its ledger phases.

The per-step table and the comparison report both call `step_verdict`, so
a run is called the same thing wherever it is shown.

A phase that is not compute bounds the step when its share of the step
reaches `BOUND_FRAC`; from `HIGHLY_BOUND_FRAC` it is "highly" so. These
are the TensorFlow profiler's input-pipeline analyzer's cuts (input-bound
from 5% of the step, highly from 20%), applied to every phase alike: each
phase is time its removal saves (what `benchmarks/ledger_fidelity.py`
checks), so 5% of the step is the same gain whichever phase it is in.
Where several phases pass, the largest names the verdict. None passing,
the run is compute-bound. A phase the run did not measure (Keras `fit`
times the input inside its step; its all-reduce is inside the compiled
step and not derived there) cannot bound it, and the verdict says so. A
derived phase (TensorFlow's custom loop derives its exposed all-reduce
from a step without it; both trainers derive contention, the compute
beyond the step timed alone; run.json's `phases_derived`) counts as
measured. "contention-bound" says the work running beside the step (the
input pipeline, a checkpoint's persist, another process) slowed its
compute by that share (`overlap_core.runtime.contention`); it names the
verdict only when no phase with a cause of its own passes the cut.

  verdict = step_verdict({"data_wait": {"fraction": 0.3}, ...},
                         phases_measured=["data_wait", "compute"])
  verdict.label  # "highly input-bound"
"""

import dataclasses
from typing import Iterable, Mapping, Optional, Tuple

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import pipeline_stats

BOUND_FRAC = 0.05  # TensorFlow profiler: "input-bound" from 5% of the step
HIGHLY_BOUND_FRAC = 0.20  # ... and "highly input-bound" from 20%

INPUT_BOUND = "input-bound"
CHECKPOINT_BOUND = "checkpoint-bound"
COMMUNICATION_BOUND = "communication-bound"
BUBBLE_BOUND = "bubble-bound"
OFFLOAD_BOUND = "offload-bound"
CONTENTION_BOUND = "contention-bound"
COMPUTE_BOUND = "compute-bound"
# The phases that can bound a step besides compute, and what each is called.
BOUNDING_PHASES = (
    (ledger_lib.DATA_WAIT, INPUT_BOUND),
    (ledger_lib.CHECKPOINT_STALL, CHECKPOINT_BOUND),
    (ledger_lib.EXPOSED_COMM, COMMUNICATION_BOUND),
    (pipeline_stats.BUBBLE, BUBBLE_BOUND),
    (ledger_lib.OFFLOAD, OFFLOAD_BOUND),
)
VERDICTS = tuple(v for _, v in BOUNDING_PHASES) + (CONTENTION_BOUND,
                                                   COMPUTE_BOUND)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A run's verdict and why.

  Attributes:
    verdict: one of VERDICTS.
    highly: the bounding phase reached HIGHLY_BOUND_FRAC.
    phase: the bounding phase, or None when compute-bound.
    fraction: its share of the step (0.0 when compute-bound).
    unmeasured: the bounding phases the run could not time.
  """
  verdict: str
  highly: bool
  phase: Optional[str]
  fraction: float
  unmeasured: Tuple[str, ...] = ()

  @property
  def label(self) -> str:
    return f"highly {self.verdict}" if self.highly else self.verdict

  def describe(self) -> str:
    """One line: the label and the numbers behind it."""
    if self.phase is None:
      line = (f"{self.label}: no phase but compute reaches "
              f"{100 * BOUND_FRAC:g}% of the step")
    else:
      cut = HIGHLY_BOUND_FRAC if self.highly else BOUND_FRAC
      line = (f"{self.label}: {self.phase} is {100 * self.fraction:.1f}% of "
              f"the step (>= {100 * cut:g}%)")
    if self.unmeasured:
      line += f"; not measured: {', '.join(self.unmeasured)}"
    return line

  def to_dict(self) -> dict:
    return {"verdict": self.verdict, "label": self.label,
            "phase": self.phase, "fraction": self.fraction,
            "unmeasured": list(self.unmeasured),
            "bound_frac": BOUND_FRAC, "highly_bound_frac": HIGHLY_BOUND_FRAC}


def step_verdict(phases: Mapping[str, Mapping[str, float]],
                 phases_measured: Optional[Iterable[str]] = None) -> Verdict:
  """The verdict of a run from its ledger phases.

  Args:
    phases: `StepLedger.summary()["phases"]` or run.json's `phases`:
      {name: {"fraction": share of the step, ...}}.
    phases_measured: the phases the run timed (run.json's
      `phases_measured`), or None to trust every phase present. A bubble
      or exposed all-reduce is measured where it is present at all.
  """
  measured = None if phases_measured is None else set(phases_measured)
  unmeasured = []
  best = None
  for phase, verdict in BOUNDING_PHASES:
    is_step_phase = phase in (ledger_lib.DATA_WAIT,
                              ledger_lib.CHECKPOINT_STALL)
    if measured is not None and is_step_phase and phase not in measured:
      unmeasured.append(phase)
      continue
    fraction = (phases.get(phase) or {}).get("fraction", 0.0)
    if fraction >= BOUND_FRAC and (best is None or fraction > best[2]):
      best = (phase, verdict, fraction)
  if best is None:
    # Contention names the verdict only when no phase with a cause of its
    # own does: it is the work beside the step, whatever it is (the input
    # pipeline, a persist, another process on the host), and a job whose
    # wait already bounds it is called by that wait.
    fraction = (phases.get(ledger_lib.CONTENTION) or {}).get("fraction", 0.0)
    if fraction >= BOUND_FRAC:
      best = (ledger_lib.CONTENTION, CONTENTION_BOUND, fraction)
  if best is None:
    return Verdict(COMPUTE_BOUND, False, None, 0.0, tuple(unmeasured))
  phase, verdict, fraction = best
  return Verdict(verdict, fraction >= HIGHLY_BOUND_FRAC, phase, fraction,
                 tuple(unmeasured))
