"""Each ledger phase against the step time its removal saves.

  python -m benchmarks.ledger_fidelity            # full run
  python -m benchmarks.ledger_fidelity --quick    # smoke run (tiny sizes)

The ledger splits every step into phases and says what bounds the steps
(`overlap_core.runtime.verdict`) on the claim that each phase is time its
removal would save. This checks the claim by intervention: per framework,
strategy (default; mirrored, which is DDP in PyTorch) and phase, the job
runs as it is and again with the phase's cause removed, the two paired
within each repeat (`benchmarks.harness`: interleaved, the first side
rotating), and the step's saving is held against what the two runs'
ledgers attribute to the cause: the change in the phase and in
`contention`, the compute beyond the step timed alone
(`overlap_core.runtime.contention`), from each run's own run.json. The
phase alone is reported beside it. What this checks is that the ledger's
compute, the step's own cost, stays put when the cause goes, so that
everything removal saves is in the phase or in the contention the
cause's work made beside the step:

  data_wait         the input made free: --synthetic_on_device keeps
                    batches resident on the device, so no input pipeline
                    runs. Same shapes and dtypes as the job's synthetic
                    input, not the same values (the resident batches are
                    drawn on the device); a step's cost does not depend on
                    them.
  checkpoint_stall  checkpoints off (--checkpoint=none against a
                    synchronous save every few steps). Reported apart: the
                    stall, and the rest of the step's increase (the save's
                    interference with the steps around it).
  offload           offload off (--offload=none against activations
                    offloaded), default strategy only. The offloading
                    run derives the phase from its step timed alone with
                    and without offload before training
                    (`overlap_core.runtime.offload_cost`); this checks
                    that derivation against separate runs.
  exposed_comm      the gradient all-reduce off (--all_reduce=off: every
                    DDP step under no_sync, the replicas training apart),
                    PyTorch's mirrored strategy only. Both sides train a
                    6M-parameter MLP (`--model=mlp --image_size=64`, 25 MB
                    of gradients) whatever --model says: the small CNN's
                    gradients cross gloo in less than the tolerance's
                    floor, which would meet the goal without testing it.

Every cell but data_wait keeps its batches resident on both sides
(--synthetic_on_device), so that its phase's cause is the only thing
removed: with an input pipeline beside the steps, a synchronous save lets
the pipeline run ahead, and the steps after it find their batches ready
and their cores free, a saving of the input's, not of the checkpoint's.

  bubble            the stages run apart (--pipeline_stages_apart against
                    a 2-stage GPipe pipeline of 4 micro-batches, PyTorch,
                    whose stages are processes): each stage computes the
                    same forwards and backwards on stand-ins held resident
                    for its neighbours' activations and gradients, so it
                    neither waits nor transfers. Both go, so the
                    attribution is the change in bubble and transfer
                    together (`Removal.attributed`), beside contention:
                    each stage's compute beyond the stage timed alone on
                    the same stand-ins before training, what the sends,
                    receives and schedule cost its work. What stays is
                    the step's closing loss all-reduce, where the faster
                    stage waits for the slower one in both runs, bubble
                    in both.

Not covered here, and why. exposed_comm in TensorFlow: the trainer derives
the phase from its step without the all-reduce, timed before training
(`tfoverlap.exposed_comm`), and has no run-long local step, so it refuses
--all_reduce=off; a run-long one would check the derivation against the
very step it derives from. Its phase stays derived, not checked by
intervention. bubble in TensorFlow: its stages run in one traced step that
hands each stage its neighbour's tensors, with no stand-in for them, so it
refuses --pipeline_stages_apart.

Verdict per cell, from the repeats: the signed miss, attributed -
saving, per repeat, over the tolerance max(10% of the median saving,
0.3 ms). The interval of its median within [-1, 1] is "met", wholly
beyond one end "missed", else "noisy". The claim is about the phase's
mean, so the verdict is on the miss's median, not on each repeat's: each
saving is the difference of two processes' step means, and a 2-core host
runs one process 0.5 ms faster or slower than the next, so the miss of a
single pair moves by about a millisecond whatever the ledger says. The
median of |miss| / tolerance, that pairing noise with any bias, is
reported beside it (`miss_over_tolerance_all`); it does not shrink with
more repeats, where the median's interval does.
"""

import functools
import math
import os
from typing import NamedTuple, Tuple

from benchmarks import common
from benchmarks import harness
from overlap_core.runtime.contention import CONTENTION

NAME = "ledger_fidelity"
DEFAULT_REPEATS = 5
FRAMEWORKS = ("tensorflow", "pytorch")
STRATEGIES = ("default", "mirrored")
# The goal: each phase within 10% of its removal's saving, or 0.3 ms,
# whichever is larger.
TOLERANCE_FRAC = 0.10
TOLERANCE_FLOOR_MS = 0.3
CHECKPOINT_EVERY = 5
# The exposed_comm cell's model, after the base flags (the last value of a
# flag wins): the size that makes two replicas' all-reduce visible in
# `tests/torch_parity/test_ledger_phases.py`.
COMM_MODEL_FLAGS = ["--model=mlp", "--image_size=64"]
# The bubble cell's pipeline: two stages cut at an even layer count, GPipe
# over 4 micro-batches, whose bubble (S-1)/(M+S-1) is a fifth of the step
# in theory.
PIPELINE_FLAGS = ["--pipeline_stages=2", "--pipeline_microbatches=4",
                  "--pipeline_split=even", "--pipeline_schedule=gpipe"]


class Removal(NamedTuple):
  """How a phase's cause is removed, and where that is checked."""
  job: list  # the job's extra flags
  removed: list  # the flags, after the job's, that remove the cause
  strategies: Tuple[str, ...]
  frameworks: Tuple[str, ...] = FRAMEWORKS
  # The phases whose change is attributed to the removal, beside
  # contention; () for the cell's phase alone.
  attributed: Tuple[str, ...] = ()


# Input made free on both sides of a cell that removes something else
# (see the docstring).
RESIDENT = ["--synthetic_on_device"]
PHASES = {
    "data_wait": Removal([], RESIDENT, STRATEGIES),
    "checkpoint_stall": Removal(
        [*RESIDENT, "--checkpoint=sync",
         f"--checkpoint_every={CHECKPOINT_EVERY}"],
        ["--checkpoint=none"], STRATEGIES),
    "offload": Removal([*RESIDENT, "--offload=activations"],
                       ["--offload=none"], ("default",)),
    # TensorFlow refuses --all_reduce=off (see the docstring).
    "exposed_comm": Removal([*RESIDENT, *COMM_MODEL_FLAGS],
                            ["--all_reduce=off"], ("mirrored",),
                            ("pytorch",)),
    # A pipeline's stages are the mirrored strategy's processes; TensorFlow
    # refuses --pipeline_stages_apart (see the docstring).
    "bubble": Removal([*RESIDENT, *PIPELINE_FLAGS],
                      ["--pipeline_stages_apart"], ("mirrored",),
                      ("pytorch",), attributed=("bubble", "transfer")),
}
JOB, REMOVED = "job", "removed"


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  common.add_synthetic_job_args(parser)
  parser.add_argument("--train_steps", type=int, default=100)
  common.add_list_arg(parser, "frameworks", default=FRAMEWORKS,
                      allowed=FRAMEWORKS, what="frameworks")
  common.add_list_arg(parser, "strategies", default=STRATEGIES,
                      allowed=STRATEGIES, what="strategies")
  common.add_list_arg(parser, "phases", default=tuple(PHASES),
                      allowed=tuple(PHASES), what="phases")
  args = parser.parse_args()
  for name, allowed in (("frameworks", FRAMEWORKS),
                        ("strategies", STRATEGIES),
                        ("phases", tuple(PHASES))):
    given = tuple(v for v in getattr(args, name).split(",") if v)
    if not given or not set(given) <= set(allowed):
      parser.error(f"--{name}={getattr(args, name)}: allowed: a "
                   f"comma-separated subset of {','.join(allowed)}")
    setattr(args, name, given)
  return args


def cells(args) -> list:
  """(framework, strategy, phase) of every cell asked for."""
  return [(f, s, p) for f in args.frameworks for p in args.phases
          for s in args.strategies
          if s in PHASES[p].strategies and f in PHASES[p].frameworks]


def base_flags(args, strategy: str, steps: int) -> list:
  return [*common.synthetic_job_flags(args), f"--train_steps={steps}",
          f"--strategy={strategy}",
          f"--num_devices={2 if strategy == 'mirrored' else 1}"]


def _phase_ms(record: dict, phase: str) -> float:
  """The phase's mean per step; 0 where no measured step recorded it."""
  mean = (record["phases"].get(phase) or {}).get("mean", 0.0)
  return 0.0 if math.isnan(mean) else 1e3 * mean


def attributed_ms(job: dict, removed: dict) -> float:
  """What the two ledgers say removing the cause saves: the change in
  its phase and in contention. A run without a reference step records no
  contention (0)."""
  return ((job["phase_ms"] + job.get("contention_ms", 0.0))
          - (removed["phase_ms"] + removed.get("contention_ms", 0.0)))


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  steps = 12 if args.quick else args.train_steps
  sides = [cell + (variant,) for cell in cells(args)
           for variant in (JOB, REMOVED)]

  def run_one(side, repeat):
    framework, strategy, phase, variant = side
    removal = PHASES[phase]
    flags = base_flags(args, strategy, steps) + removal.job + (
        removal.removed if variant == REMOVED else [])
    record, stats = common.run_trainer_record(
        flags, os.path.join(scratch, "-".join(side) + f"-{repeat}"),
        module=common.TRAINER_MODULES[framework])
    common.log(f"repeat {repeat + 1}/{repeats} {' '.join(side)}: step "
               f"{_phase_ms(record, 'step'):.2f} ms, {phase} "
               f"{_phase_ms(record, phase):.2f} ms")
    return {"side": list(side), "repeat": repeat, "flags": flags,
            "step_ms": _phase_ms(record, "step"),
            "phase_ms": sum(_phase_ms(record, p)
                            for p in removal.attributed or (phase,)),
            "contention_ms": _phase_ms(record, CONTENTION),
            # Every phase, for what moved where the attribution misses.
            "all_phases_ms": {p: _phase_ms(record, p)
                              for p in record["phases"]},
            # What contention was taken against (None: no reference).
            "reference_ms": (record["strategy"].get("reference_step")
                             or {}).get("reference_ms"),
            # Its timed calls: a slow spell of the host shows there.
            "reference_calls_ms": (record["strategy"].get("reference_step")
                                   or {}).get("step_ms"),
            "phases_measured": record["phases_measured"],
            "phases_derived": record.get("phases_derived", []),
            "verdict": record.get("verdict"),
            "process": common.process_stats(stats)}

  record = harness.run_interleaved(sides, repeats, run_one,
                                   redo_busy=args.redo_busy)
  return harness.Measured.of_group(
      record, train_steps=steps, setting=base_flags(args, "STRATEGY", steps),
      tolerance={"frac": TOLERANCE_FRAC, "floor_ms": TOLERANCE_FLOOR_MS})


def summarize_cell(job_runs: list, removed_runs: list) -> dict:
  """One cell's attribution against its saving, paired by repeat."""
  removed = {r["repeat"]: r for r in removed_runs}
  pairs = [(r, removed[r["repeat"]]) for r in job_runs
           if r["repeat"] in removed]
  savings = [j["step_ms"] - x["step_ms"] for j, x in pairs]
  phases = [j["phase_ms"] for j, _ in pairs]
  attributed = [attributed_ms(j, x) for j, x in pairs]
  tolerance_ms = max(TOLERANCE_FRAC * abs(common.median(savings)),
                     TOLERANCE_FLOOR_MS)
  signed = [(a - s) / tolerance_ms for a, s in zip(attributed, savings)]
  cell = {
      "repeats": len(pairs),
      "phase_ms": common.median(phases),
      "attributed_ms": common.median(attributed),
      "saving_ms": common.median(savings),
      "phase_ms_all": phases, "attributed_ms_all": attributed,
      "saving_ms_all": savings,
      # The removal's saving beyond the phase alone: for a checkpoint, the
      # save's interference with the steps around it.
      "rest_of_increase_ms": common.median(
          [s - p for p, s in zip(phases, savings)]),
      "tolerance_ms": tolerance_ms,
      "miss_over_tolerance_all": [abs(m) for m in signed],
      "signed_miss_over_tolerance_all": signed,
  }
  cell["target"] = harness.median_interval(signed)
  cell["target_verdict"] = harness.verdict_within(cell["target"], 1.0)
  return cell


def summarize(payload: dict) -> list:
  by_side = {}
  for run in payload["runs"]:
    by_side.setdefault(tuple(run["side"]), []).append(run)
  summary = []
  for side in by_side:
    framework, strategy, phase, variant = side
    if variant != JOB:
      continue
    cell = summarize_cell(by_side[side],
                          by_side.get(side[:3] + (REMOVED,), []))
    removal = PHASES.get(phase)  # None: a phase since renamed
    summary.append({"framework": framework, "strategy": strategy,
                    "phase": phase,
                    "phases": list(removal and removal.attributed
                                   or (phase,)),
                    **cell})
  return summary


def format_summary(payload: dict) -> str:
  headers = ["framework", "strategy", "phase", "phase ms",
             "phase + contention change ms", "saving ms",
             "rest of increase ms", "repeats", "within tolerance"]
  rows = [[c["framework"], c["strategy"], c["phase"], c["phase_ms"],
           c.get("attributed_ms", c["phase_ms"]), c["saving_ms"],
           c["rest_of_increase_ms"], c["repeats"], c["target_verdict"]]
          for c in payload["summary"]]
  return common.format_table(headers, rows)


def main():
  args = parse_args()
  harness.main(NAME, args, functools.partial(measure, args),
               default_repeats=DEFAULT_REPEATS, summarize=summarize,
               table=format_summary)


if __name__ == "__main__":
  main()
