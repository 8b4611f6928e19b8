"""Each ledger phase against the step time its removal saves.

  python -m benchmarks.ledger_fidelity            # full run
  python -m benchmarks.ledger_fidelity --quick    # smoke run (tiny sizes)

The ledger splits every step into phases and says what bounds the steps
(`overlap_core.runtime.verdict`) on the claim that each phase is time its
removal would save. This checks the claim by intervention: per framework,
strategy (default; mirrored, which is DDP in PyTorch) and phase, the job
runs as it is and with the phase's cause removed, and the step's saving
is held against what the ledger attributes to the cause: the change in
the phase and in `contention`, the compute beyond the step timed alone
(`overlap_core.runtime.contention`). The phase alone is reported beside
it.

The trainer removes every cause for some steps only (the input,
checkpoints, offload, the gradient all-reduce, the pipeline's waits:
`--paired_removal`, `overlap_core.runtime.paired_removal`), so one run
holds both sides: blocks of 20 steps alternate with and without the
cause, and its run.json gives each half's phases over the steps counted.
That run trains twice --train_steps. --two_runs runs the two sides as
two runs instead, paired within each repeat (`benchmarks.harness`:
interleaved, the first side rotating), as every cell was before the
trainer could alternate. Two runs differ in the
processes' own speed: a 2-core host runs one process about half a
millisecond a step faster or slower than the next; the two halves of one
run share its process, its calibration of the step alone, and its host.
What this checks is that the ledger's compute, the step's own cost, stays
put when the cause goes, so that everything removal saves is in the phase
or in the contention the cause's work made beside the step:

  data_wait         the input made free: in one run, a step without it
                    takes one of the run's own batches, held resident, a
                    distinct one each such step, and asks the pipeline
                    for nothing; in two runs, --synthetic_on_device keeps
                    one batch resident on the device, so no input
                    pipeline runs (the same batch every step: a model
                    that comes to fit it steps faster, which is why the
                    one-run cells take batches of their own).
  checkpoint_stall  checkpoints off against a synchronous save every few
                    steps (in one run, the blocks without take none; in
                    two runs, --checkpoint=none). Reported apart: the
                    stall, and the rest of the step's increase (the save's
                    interference with the steps around it). These runs
                    train four times --train_steps, so that each holds
                    four times the saves.
  offload           offload off against activations offloaded (in one
                    run, the blocks without run with offload paused; in
                    two runs, --offload=none), default strategy only.
                    The offloading steps carry the phase derived from the
                    step timed alone with and without offload before
                    training (`overlap_core.runtime.offload_cost`); this
                    checks that derivation against the steps without.
  exposed_comm      the gradient all-reduce off, mirrored strategy only:
                    in one run, the blocks without run DDP's step under
                    no_sync (PyTorch) or the step that applies each
                    replica's own gradients (TensorFlow); in two runs,
                    --all_reduce=off runs every DDP step under no_sync
                    (PyTorch only: TensorFlow has no run-long local
                    step). Either way the replicas' weights part, which
                    does not change a step's cost. TensorFlow's phase is
                    derived from the step timed with and without the
                    all-reduce before training (`tfoverlap.exposed_comm`),
                    so its cell checks that derivation against the steps
                    without; PyTorch's is timed in every step. Both sides
                    train a 6M-parameter MLP (`--model=mlp
                    --image_size=64`, 25 MB of gradients) whatever --model
                    says: the small CNN's gradients cross in less than
                    the tolerance's floor, which would meet the goal
                    without testing it.

Every cell but data_wait keeps its batches resident on both sides
(--synthetic_on_device), so that its phase's cause is the only thing
removed: with an input pipeline beside the steps, a synchronous save lets
the pipeline run ahead, and the steps after it find their batches ready
and their cores free, a saving of the input's, not of the checkpoint's.

  bubble            the stages run apart (--paired_removal=pipeline_waits,
                    or --pipeline_stages_apart with --two_runs) in a
                    2-stage GPipe pipeline of 4 micro-batches, whose
                    stages are processes (PyTorch's ranks; TensorFlow's
                    stage servers, --pipeline_runtime=processes, each on
                    one thread, whose waits are stamped on each stage's
                    process): each stage computes the
                    same forwards and backwards on stand-ins held resident
                    for its neighbours' activations and gradients, so it
                    neither waits nor transfers. Both go, so the
                    attribution is the change in bubble and transfer
                    together (`Removal.attributed`), beside contention:
                    each stage's compute beyond the stage timed alone on
                    the same stand-ins before training, one stage at a
                    time, what the sends, receives, schedule and the
                    other stages' work beside it cost its work (both
                    sides: TensorFlow's stage servers are timed in turn
                    by their client, and its ledger's contention is the
                    mean stage's, so its stages' slowing of each other
                    when apart, which shrinks the saving, is attributed
                    there; BENCHMARKS §17 ran before they were). What stays is
                    the step's closing loss all-reduce, where the faster
                    stage waits for the slower one on both sides,
                    bubble on both.

Not covered here, and why: the bubble of TensorFlow's devices runtime.
It derives the bubble from its stages timed alone, so stages apart would
check the derivation against itself; it refuses --pipeline_stages_apart.

Verdict per cell, from the repeats: the signed miss, attributed -
saving, per repeat, over the tolerance max(10% of the median saving,
0.3 ms). The interval of its median within [-1, 1] is "met", wholly
beyond one end "missed", else "noisy". The claim is about the phase's
mean, so the verdict is on the miss's median, not on each repeat's: where
a saving is the difference of two processes' step means, the miss of a
single pair moves by about a millisecond whatever the ledger says. The
median of |miss| / tolerance, that pairing noise with any bias, is
reported beside it (`miss_over_tolerance_all`); it does not shrink with
more repeats, where the median's interval does.
"""

import functools
import math
import os
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple

from benchmarks import common
from benchmarks import harness
from overlap_core.runtime import paired_removal
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
# TensorFlow's stages as processes, each on one thread, as PyTorch's are
# (benchmarks.tf_pipeline): the runtime whose waits are stamped on each
# stage's process, and the only one that runs its stages apart.
TF_STAGE_PROCESSES_FLAGS = ["--pipeline_runtime=processes",
                            "--intra_op_threads=1", "--inter_op_threads=1"]


class Removal(NamedTuple):
  """How a phase's cause is removed, and where that is checked."""
  job: list  # the job's extra flags
  removed: list  # the flags, after the job's, that remove the cause
  strategies: Tuple[str, ...]
  frameworks: Tuple[str, ...] = FRAMEWORKS
  # The phases whose change is attributed to the removal, beside
  # contention; () for the cell's phase alone.
  attributed: Tuple[str, ...] = ()
  # The trainer's --paired_removal cause that removes it within one run;
  # "": only a second run can.
  in_run: str = ""
  # The frameworks whose trainer takes `removed` (--two_runs); None: all
  # of `frameworks`.
  two_runs_frameworks: Optional[Tuple[str, ...]] = None
  # Flags a framework's sides add after `job`.
  framework_job: Mapping[str, Sequence[str]] = {}
  # The frameworks whose sides run through their launcher.
  launched: Tuple[str, ...] = ()
  # The cell's runs train this many times --train_steps (not --quick).
  steps_scale: int = 1


# Input made free on both sides of a cell that removes something else
# (see the docstring).
RESIDENT = ["--synthetic_on_device"]
PHASES = {
    "data_wait": Removal([], RESIDENT, STRATEGIES,
                         in_run=paired_removal.INPUT),
    "checkpoint_stall": Removal(
        [*RESIDENT, "--checkpoint=sync",
         f"--checkpoint_every={CHECKPOINT_EVERY}"],
        ["--checkpoint=none"], STRATEGIES,
        in_run=paired_removal.CHECKPOINT,
        # A save is an event, not a step's part: at --train_steps=100 the
        # counted half holds 10 of them, and DDP's saving ran from -0.85
        # to 3.73 ms over 81 runs (its step's change: 1.0 ms standard
        # deviation), leaving the median's interval wider than the goal.
        # Four times the saves halved that spread (0.45 ms) and decided
        # the cell (BENCHMARKS §17).
        steps_scale=4),
    "offload": Removal([*RESIDENT, "--offload=activations"],
                       ["--offload=none"], ("default",),
                       in_run=paired_removal.OFFLOAD),
    # TensorFlow refuses --all_reduce=off (see the docstring).
    "exposed_comm": Removal([*RESIDENT, *COMM_MODEL_FLAGS],
                            ["--all_reduce=off"], ("mirrored",),
                            in_run=paired_removal.ALL_REDUCE,
                            two_runs_frameworks=("pytorch",)),
    # A pipeline's stages are the mirrored strategy's devices: PyTorch's
    # processes; TensorFlow's stage servers, which its launcher starts.
    "bubble": Removal([*RESIDENT, *PIPELINE_FLAGS],
                      ["--pipeline_stages_apart"], ("mirrored",),
                      attributed=("bubble", "transfer"),
                      in_run=paired_removal.PIPELINE_WAITS,
                      framework_job={"tensorflow": TF_STAGE_PROCESSES_FLAGS},
                      launched=("tensorflow",)),
}
JOB, REMOVED = "job", "removed"
# A run that holds both: the cause removed in alternate blocks of steps.
IN_RUN = "in_run"
# Blocks of 20 steps, the first 10 settling: deeper than the input's
# prefetch buffers, and 2 checkpoints of every 5 steps in the counted half.
IN_RUN_BLOCK_STEPS = 20
QUICK_IN_RUN_BLOCK_STEPS = 4


def parse_args():
  parser = common.make_parser(__doc__, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  common.add_synthetic_job_args(parser)
  parser.add_argument("--train_steps", type=int, default=100,
                      help="Steps of a two-run side; a run that holds "
                      "both sides trains twice as many, and a checkpoint "
                      "cell's runs four times that.")
  parser.add_argument("--two_runs", action="store_true",
                      help="Every cell as two runs, one with the cause and "
                      "one without, as before the trainer could remove "
                      "the cause in alternate blocks of one run.")
  common.add_list_arg(parser, "frameworks", default=FRAMEWORKS,
                      allowed=FRAMEWORKS, what="frameworks")
  common.add_list_arg(parser, "strategies", default=STRATEGIES,
                      allowed=STRATEGIES, what="strategies")
  common.add_list_arg(parser, "phases", default=tuple(PHASES),
                      allowed=tuple(PHASES), what="phases")
  parser.add_argument(
      "--cells", default="",
      help="Only these cells, as framework:strategy:phase, comma-separated "
      "(e.g. tensorflow:mirrored:data_wait), of those --frameworks, "
      "--strategies and --phases select; empty: all of them.")
  args = parser.parse_args()
  args.cells = tuple(tuple(c.split(":")) for c in args.cells.split(",") if c)
  for cell in args.cells:
    framework, strategy, phase = (cell + ("", "", ""))[:3]
    if (len(cell) != 3 or framework not in FRAMEWORKS
        or strategy not in STRATEGIES or phase not in PHASES):
      parser.error(f"--cells: {':'.join(cell)!r} is not framework:strategy:"
                   f"phase; allowed: {'|'.join(FRAMEWORKS)}:"
                   f"{'|'.join(STRATEGIES)}:{'|'.join(PHASES)}")
  for name, allowed in (("frameworks", FRAMEWORKS),
                        ("strategies", STRATEGIES),
                        ("phases", tuple(PHASES))):
    given = tuple(v for v in getattr(args, name).split(",") if v)
    if not given or not set(given) <= set(allowed):
      parser.error(f"--{name}={getattr(args, name)}: allowed: a "
                   f"comma-separated subset of {','.join(allowed)}")
    setattr(args, name, given)
  return args


def _frameworks(args, removal: Removal) -> Tuple[str, ...]:
  if args.two_runs or not removal.in_run:
    return removal.two_runs_frameworks or removal.frameworks
  return removal.frameworks


def cells(args) -> list:
  """(framework, strategy, phase) of every cell asked for."""
  return [(f, s, p) for f in args.frameworks for p in args.phases
          for s in args.strategies
          if s in PHASES[p].strategies and f in _frameworks(args, PHASES[p])
          and (not args.cells or (f, s, p) in args.cells)]


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


def variants(args, phase: str) -> Tuple[str, ...]:
  """The sides of a cell: one run holding both, or two runs."""
  if PHASES[phase].in_run and not args.two_runs:
    return (IN_RUN,)
  return (JOB, REMOVED)


def side_flags(args, side) -> list:
  """The trainer flags of one side of a cell (both trainers take the same
  flags, and a framework's own after them)."""
  framework, strategy, phase, variant = side
  removal = PHASES[phase]
  steps = 12 if args.quick else args.train_steps * removal.steps_scale
  job = [*removal.job, *removal.framework_job.get(framework, ())]
  if variant == IN_RUN:
    block_steps = (QUICK_IN_RUN_BLOCK_STEPS if args.quick
                   else IN_RUN_BLOCK_STEPS)
    return base_flags(args, strategy, 2 * steps) + job + [
        f"--paired_removal={removal.in_run}",
        f"--paired_block_steps={block_steps}"]
  return base_flags(args, strategy, steps) + job + (
      removal.removed if variant == REMOVED else [])


def _run_side(framework: str, phase: str, flags, model_dir: str):
  """(run.json, process costs) of one side: through the framework's
  launcher where the cell's runs need one (TensorFlow's stage servers)."""
  if framework in PHASES[phase].launched:
    return common.run_trainer_record(
        flags, model_dir, module=common.LAUNCHER_MODULES[framework],
        launcher_flags=[])
  return common.run_trainer_record(
      flags, model_dir, module=common.TRAINER_MODULES[framework])


def _half(phases_ms: dict, phase: str) -> dict:
  """One side's figures from its phase means in ms (a run's, or one half
  of a run that holds both)."""
  removal = PHASES.get(phase)  # None: a phase since renamed
  return {"step_ms": phases_ms["step"],
          "phase_ms": sum(phases_ms.get(p, 0.0)
                          for p in removal and removal.attributed
                          or (phase,)),
          "contention_ms": phases_ms.get(CONTENTION, 0.0),
          # Every phase, for what moved where the attribution misses.
          "all_phases_ms": phases_ms}


def measure(args, repeats: int, scratch: str) -> harness.Measured:
  steps = 12 if args.quick else args.train_steps
  sides = [cell + (variant,) for cell in cells(args)
           for variant in variants(args, cell[2])]

  def run_one(side, repeat):
    framework, strategy, phase, variant = side
    flags = side_flags(args, side)
    record, stats = _run_side(
        framework, phase, flags,
        os.path.join(scratch, "-".join(side) + f"-{repeat}"))
    run = {"side": list(side), "repeat": repeat, "flags": flags}
    if variant == IN_RUN:
      paired = record["paired_removal"]
      halves = paired["halves"]
      run["halves"] = {
          JOB: _half(halves[paired_removal.WITH]["phases_ms"], phase),
          REMOVED: _half(halves[paired_removal.WITHOUT]["phases_ms"], phase)}
      run["paired_removal"] = paired
      saving = ("none (a half counted no step)"
                if paired["saving_ms"] is None
                else f"{paired['saving_ms']:.2f} ms")
      common.log(f"repeat {repeat + 1}/{repeats} {' '.join(side)}: saving "
                 f"{saving}, {phase} "
                 f"{run['halves'][JOB]['phase_ms']:.2f} ms with, "
                 f"{run['halves'][REMOVED]['phase_ms']:.2f} ms without")
    else:
      run.update(_half({p: _phase_ms(record, p) for p in record["phases"]},
                       phase))
      common.log(f"repeat {repeat + 1}/{repeats} {' '.join(side)}: step "
                 f"{run['step_ms']:.2f} ms, {phase} "
                 f"{_phase_ms(record, phase):.2f} ms")
    return {**run,
            # What contention was taken against (None: no reference).
            "reference_ms": (record["strategy"].get("reference_step")
                             or {}).get("reference_ms"),
            # Its timed calls: a slow spell of the host shows there.
            "reference_calls_ms": (record["strategy"].get("reference_step")
                                   or {}).get("step_ms"),
            # The same calls timed again after the loop (empty where the
            # reference is timed once); the reference is the lower median.
            "reference_later_calls_ms": (
                record["strategy"].get("reference_step")
                or {}).get("later_step_ms"),
            "phases_measured": record["phases_measured"],
            "phases_derived": record.get("phases_derived", []),
            # What the run moved between phases after the fact
            # (contention's settled balance), in ms per measured step.
            "phases_moved_ms": record.get("phases_moved_ms"),
            "verdict": record.get("verdict"),
            "process": common.process_stats(stats)}

  record = harness.run_interleaved(sides, repeats, run_one,
                                   redo_busy=args.redo_busy)
  return harness.Measured.of_group(
      record, train_steps=steps, setting=base_flags(args, "STRATEGY", steps),
      tolerance={"frac": TOLERANCE_FRAC, "floor_ms": TOLERANCE_FLOOR_MS},
      in_run_block_steps=(None if args.two_runs else
                          QUICK_IN_RUN_BLOCK_STEPS if args.quick
                          else IN_RUN_BLOCK_STEPS))


def summarize_cell(pairs: list) -> dict:
  """One cell's attribution against its saving, over its (job, removed)
  pairs: the two runs of a repeat, or the two halves of one run."""
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


def cell_pairs(by_side: dict, side: tuple) -> list:
  """A cell's (job, removed) pairs from its job side or in-run side."""
  if side[3] == IN_RUN:
    return [(run["halves"][JOB], run["halves"][REMOVED])
            for run in by_side[side]]
  removed = {r["repeat"]: r for r in by_side.get(side[:3] + (REMOVED,), [])}
  return [(r, removed[r["repeat"]]) for r in by_side[side]
          if r["repeat"] in removed]


def summarize(payload: dict) -> list:
  by_side = {}
  for run in payload["runs"]:
    by_side.setdefault(tuple(run["side"]), []).append(run)
  summary = []
  for side in by_side:
    framework, strategy, phase, variant = side
    if variant not in (JOB, IN_RUN):
      continue
    cell = summarize_cell(cell_pairs(by_side, side))
    removal = PHASES.get(phase)  # None: a phase since renamed
    summary.append({"framework": framework, "strategy": strategy,
                    "phase": phase,
                    "phases": list(removal and removal.attributed
                                   or (phase,)),
                    "pairing": "in one run" if variant == IN_RUN
                               else "two runs",
                    **cell})
  return summary


def format_summary(payload: dict) -> str:
  headers = ["framework", "strategy", "phase", "pairing", "phase ms",
             "phase + contention change ms", "saving ms",
             "rest of increase ms", "repeats", "within tolerance"]
  rows = [[c["framework"], c["strategy"], c["phase"],
           c.get("pairing", "two runs"), c["phase_ms"],
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
