"""The trainer's per-step bookkeeping in `model.fit`, switched on and off in
blocks of steps of one fit: its overhead on the user's own Keras model.

  python -m benchmarks.fit_ledger_blocks --intra_op_threads=1 \
      --inter_op_threads=1                  # the Keras example, 31 fits
  python -m benchmarks.fit_ledger_blocks --quick   # smoke run

Why blocks. Section 18 compares whole runs of the trainer with whole runs
of plain `model.fit`, one after the other in one process. On the Keras
example (a step of about 3 ms on 2 CPU cores, mostly Keras' own Python
and the example's per-element input map) the step time moves by 20 to 40%
from one tenth of a second to the next, so two runs of 10 s each, seconds
apart, differ by up to 25%, and 31 repeats leave the median's interval
wider than the 2% goal. Here the two sides alternate every `BLOCK_STEPS`
steps within one fit, so each side's steps are never more than a few
tenths of a second from the other's.

What is switched. The trainer's `--loop=fit` is `model.fit` with one
callback, `tfoverlap.ledger.FitStepTimer`, that feeds the step ledger;
`tfoverlap.ledger.LedgerCallback` is that timer with the ledger a user's
own fit gets (the same `LoopContext`, the same `after_execution` per
step). Each repeat is one fit of the example's model (built, compiled and
fed by `benchmarks.plain_keras_fit.prepare`, as the plain baseline is)
with `_Gate(LedgerCallback)` and `_StepStamps` as its callbacks. The gate
passes the ledger its batch hooks only in the "on" blocks, in the order
off, on, on, off for every `4 * BLOCK_STEPS` steps, so that a drift over
the cycle weighs on both sides alike; everything else (begin and end of
training and epoch) it always passes, so the ledger records the "on"
steps as a run of their own and writes its run.json at the end. The
stamps callback goes last and records when each step's callbacks are
done: a step's time is from the previous stamp to its own, so it holds
the step and everything every callback did for it, and the ledger's
closing of a step (done when the next "on" step begins) falls in an "on"
step. The first cycle is warm-up (the ledger reads more clocks on its
first 16 steps) and is not counted.

What it leaves out, by design: what the trainer does outside the steps
(building, tracing, run.json) and any difference in the input pipeline;
both sides here are the same fit of the same pipeline. Section 18's whole
runs hold those.

The measure per repeat is the mean step of the "on" steps over the mean
step of the "off" steps (means, because the ledger's cost falls on some
steps only: it reads the process's clocks on one step in 8). The target is
at most 1.02: the median of the per-repeat ratios with its interval,
judged by `harness.verdict`. Any --flag=value goes to the configuration,
e.g. `--intra_op_threads=1 --inter_op_threads=1`.

`benchmarks.loop_ledger_blocks` is the same comparison on PyTorch's
example, in a plain loop; the blocks, the stamps, the measure and the
harness's part (`measure_blocks`) are shared from here.
"""

import functools
import statistics
import time
from typing import Callable

from benchmarks import common
from benchmarks import harness
from benchmarks import user_model_overhead
from overlap_core.runtime import paired_removal

NAME = "fit_ledger_blocks"
TARGET = 1.0 + user_model_overhead.TARGET_MAX_OVERHEAD_FRAC
DEFAULT_REPEATS = 31
EXAMPLE = "keras_regression"
# A multiple of 8: every block holds as many of the ledger's clock-reading
# steps (one in 8) as any other.
BLOCK_STEPS = 16
CYCLE_STEPS = 4 * BLOCK_STEPS
# A fit of about 12 s of a 3 ms step: 62 cycles after the warm-up one.
STEPS = 4032
QUICK_STEPS = 2 * CYCLE_STEPS
OFF, ON = "off", "on"


def block_side(step_index: int) -> str:
  """OFF or ON for a 0-based step of the fit: off, on, on, off per cycle,
  the order of --paired_removal's blocks (on: its blocks without)."""
  return (ON if paired_removal.in_block_without(step_index + 1, BLOCK_STEPS)
          else OFF)


def _callbacks(ledger):
  """(the gate around `ledger`, the step stamps): the fit's callbacks, in
  that order."""
  import keras  # pylint: disable=g-import-not-at-top

  class _Gate(keras.callbacks.Callback):
    """Passes `ledger` its batch hooks in the "on" blocks only."""

    def set_model(self, model):
      super().set_model(model)
      ledger.set_model(model)

    def set_params(self, params):
      super().set_params(params)
      ledger.set_params(params)

    def on_train_begin(self, logs=None):
      ledger.on_train_begin(logs)

    def on_train_end(self, logs=None):
      ledger.on_train_end(logs)

    def on_epoch_begin(self, epoch, logs=None):
      ledger.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
      ledger.on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
      if block_side(batch) == ON:
        ledger.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
      if block_side(batch) == ON:
        ledger.on_train_batch_end(batch, logs)

  class _StepStamps(keras.callbacks.Callback):
    """When each step's callbacks were done."""

    def __init__(self):
      super().__init__()
      self.stamps_s = []

    def on_train_batch_end(self, batch, logs=None):
      self.stamps_s.append(time.perf_counter())

  return _Gate(), _StepStamps()


def steps_by_side(stamps_s) -> dict:
  """{OFF, ON: [step seconds]} of the counted steps (after the first
  cycle), each from the previous stamp to its own."""
  steps = {OFF: [], ON: []}
  for index in range(CYCLE_STEPS, len(stamps_s)):
    steps[block_side(index)].append(stamps_s[index] - stamps_s[index - 1])
  return steps


def blocks_result(stamps_s, steps: int, run_s: float, run_dir: str) -> dict:
  """One repeat's result: each side's counted steps, their mean and median
  in ms, the ratio of the means, and the steps the ledger counted in its
  run.json (`run_dir`)."""
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import run_record
  # pylint: enable=g-import-not-at-top
  result = {"run_s": run_s, "steps": steps,
            "ledger_steps": run_record.load_run_record(run_dir)["steps"]}
  for side, seconds in steps_by_side(stamps_s).items():
    result[side] = {"steps": len(seconds),
                    "mean_ms": 1e3 * statistics.fmean(seconds),
                    "median_ms": 1e3 * statistics.median(seconds)}
  result["ratio"] = result[ON]["mean_ms"] / result[OFF]["mean_ms"]
  return result


def fit_once(prepared, steps: int, run_dir: str, batch_size: int) -> dict:
  """One fit of `steps` steps with the gated ledger; its result."""
  # pylint: disable=g-import-not-at-top
  from tfoverlap.ledger import LedgerCallback
  # pylint: enable=g-import-not-at-top
  ledger = LedgerCallback(run_dir, batch_size=batch_size, progress=False)
  gate, stamps = _callbacks(ledger)
  start_s = time.perf_counter()
  prepared.model.fit(prepared.dataset, epochs=1, steps_per_epoch=steps,
                     verbose=0, callbacks=[gate, stamps])
  return blocks_result(stamps.stamps_s, steps, time.perf_counter() - start_s,
                       run_dir)


def trainer_config(name: str, flags):
  """The TrainConfig of `flags`, parsed as the trainers parse theirs;
  exits 2 with one line on a refusal."""
  # pylint: disable=g-import-not-at-top
  import flags as tfo_flags
  from absl import logging
  # pylint: enable=g-import-not-at-top
  tfo_flags.define_flags()
  tfo_flags.parse_or_exit([name, *flags])
  logging.set_verbosity(logging.WARNING)
  return tfo_flags.to_config(tfo_flags.FLAGS)


def measure_blocks(name: str, example: str, args, passthrough,
                   repeats: int, scratch_root: str, *,
                   prepare: Callable, run_once: Callable
                   ) -> harness.Measured:
  """Every repeat of a blocks benchmark, interleaved by the harness.

  Args:
    name: the benchmark's name (its program name for the flags).
    example: the `user_model_overhead.EXAMPLES` example trained.
    prepare: prepare(config) -> what `run_once` trains, made once and
      warmed up (its first steps traced).
    run_once: run_once(prepared, config, steps, run_dir) -> one repeat's
      `blocks_result`.
  """
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import host_allocator
  # pylint: enable=g-import-not-at-top
  flags = [*user_model_overhead.EXAMPLES[example]["flags"], *passthrough]
  config = trainer_config(name, flags)
  # What the trainers' entry point sets once per process.
  host_allocator.apply(config.run.host_allocator)
  prepared = prepare(config)
  steps = QUICK_STEPS if args.quick else STEPS

  def run_one(side, repeat):
    run_dir = common.make_run_dir(scratch_root, f"{side}-{repeat}")
    result = run_once(prepared, config, steps, run_dir)
    common.log(f"repeat {repeat + 1}/{repeats}: off {result[OFF]['mean_ms']:.3f}"
               f" ms, on {result[ON]['mean_ms']:.3f} ms, ratio "
               f"{result['ratio']:.4f}")
    return {"side": side, "repeat": repeat, "result": result}

  record = harness.run_interleaved(["gated"], repeats, run_one,
                                   redo_busy=args.redo_busy)
  return harness.Measured.of_group(
      record, example=example, flags=flags, block_steps=BLOCK_STEPS,
      warmup_steps=CYCLE_STEPS, steps_per_run=steps, target=TARGET)


def _prepare_fit(config):
  """The example compiled and fed as plain Keras would, its step traced by
  a first fit of one cycle, none of whose steps is counted."""
  # pylint: disable=g-import-not-at-top
  from benchmarks import plain_keras_fit
  # pylint: enable=g-import-not-at-top
  prepared = plain_keras_fit.prepare(config)
  prepared.model.fit(prepared.dataset, epochs=1, steps_per_epoch=CYCLE_STEPS,
                     verbose=0)
  return prepared


def measure(args, passthrough, repeats: int, scratch_root: str
            ) -> harness.Measured:
  return measure_blocks(
      NAME, EXAMPLE, args, passthrough, repeats, scratch_root,
      prepare=_prepare_fit,
      run_once=lambda prepared, config, steps, run_dir: fit_once(
          prepared, steps, run_dir, config.data.batch_size))


def summarize(payload: dict) -> dict:
  results = [r["result"] for r in payload["runs"]]
  ratio = harness.summarize_ratios([r[ON]["mean_ms"] for r in results],
                                   [r[OFF]["mean_ms"] for r in results])
  extra_ms = [r[ON]["mean_ms"] - r[OFF]["mean_ms"] for r in results]
  return {
      "off_mean_ms_median": statistics.median(r[OFF]["mean_ms"]
                                              for r in results),
      "on_mean_ms_median": statistics.median(r[ON]["mean_ms"]
                                             for r in results),
      "extra_ms_median": statistics.median(extra_ms),
      "judged": harness.judge(ratio, payload["target"]),
  }


def format_summary(payload: dict) -> str:
  s = payload["summary"]
  return common.format_table(
      ["example", "steps per run", "off mean step ms", "on mean step ms",
       "on - off ms", "per-run ratio: median [interval]",
       f"target <= {payload['target']:g}"],
      [[payload["example"], payload["steps_per_run"], s["off_mean_ms_median"],
        s["on_mean_ms_median"], s["extra_ms_median"],
        harness.format_interval(s["judged"]), s["judged"]["verdict"]]])


def main_for(name: str, doc: str, measure_fn: Callable) -> None:
  """The main of a blocks benchmark: its flags, then `harness.main`."""
  parser = common.make_parser(doc, repeats=DEFAULT_REPEATS,
                              resummarize=True)
  args, passthrough = common.parse_with_trainer_flags(parser)
  harness.main(name, args, functools.partial(measure_fn, args, passthrough),
               default_repeats=DEFAULT_REPEATS, summarize=summarize,
               table=format_summary)


if __name__ == "__main__":
  main_for(NAME, __doc__, measure)
