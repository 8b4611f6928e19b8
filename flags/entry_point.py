"""The commands' shared main(): flags in, one run, its summary or one line out.

Both `python -m tfoverlap.train` and `python -m torch_parity.train` are this
function with their own `train`: the same flag parsing, the same exit
statuses (2 for a flag or setting the trainer refuses, 1 for a run that
failed) and the same end-of-run table. The framework is imported only inside
`train`, after the flags parsed, so `--helpfull` and a bad flag answer at
once. The planning commands' mains are made here too (`make_plan_main`).
"""

import sys
from typing import Callable, Optional, Tuple, Type

from absl import app
from absl import logging

import flags as tfo_flags
from overlap_core.runtime import (compat, failure, host_allocator, summary,
                                  waits)
from overlap_core.runtime.config import ConfigError, TrainConfig


def run_trainer(program: str, framework: str,
                train: Callable[[TrainConfig], Optional[dict]],
                runtime_errors: Callable[[], Tuple[Type[BaseException], ...]]
                ) -> None:
  """Runs `train` on the parsed flags and reports how it ended.

  Args:
    program: the entry point, as error lines name it ("tfoverlap.train").
    framework: as run.json names it ("tensorflow"), for the failure record.
    train: runs one training from the config; returns the run record, or
      None in a process that reports nothing (a replica other than rank 0).
    runtime_errors: the exception types that mean "the run failed" (a lost
      peer, an exhausted device, a full disk), called only once an error is
      raised, so it may import the framework.
  """
  config = tfo_flags.to_config(tfo_flags.FLAGS)
  # Before the framework is imported: its first allocations follow it too.
  host_allocator.apply(config.run.host_allocator)
  if not tfo_flags.FLAGS["verbosity"].present:
    # The frameworks log every collective they set up at INFO;
    # --verbosity=0 brings that back.
    logging.set_verbosity(logging.WARNING)
  try:
    # What the compatibility table refuses on any host, before the
    # framework's import; `train` checks everything again.
    compat.check_without_host(config, framework)
    record = train(config)
  except ConfigError as e:
    tfo_flags.exit_with_config_error(e)
  except runtime_errors() as e:  # pylint: disable=catching-non-exception
    # One line for the user (saying so when a peer stopped answering) and
    # a failure record in run.json's place; the traceback stays available
    # with --verbosity=1.
    logging.debug("training failed", exc_info=True)
    failure.record_failure(config, e, framework=framework)
    tfo_flags.exit_with_runtime_error(program, waits.explain(e))
  if record is not None and record["worker"]["index"] == 0:
    print(summary.format_breakdown(
        record, phases_measured=record["phases_measured"],
        phases_derived=record.get("phases_derived", ())))
    print(summary.format_final(record))


def make_trainer_main(program: str, framework: str,
                      train: Callable[[TrainConfig], Optional[dict]],
                      runtime_errors: Callable[[], Tuple[Type[BaseException],
                                                         ...]]):
  """(main, run_main) of a trainer entry point: `run_main()` parses the
  flags (exit 2 on a bad one) and calls `main`, which is `run_trainer`."""

  def main(argv):
    del argv  # parse_or_exit refuses positional arguments
    run_trainer(program, framework, train, runtime_errors)

  def run_main():
    app.run(main, argv=sys.argv, flags_parser=tfo_flags.parse_or_exit)

  return main, run_main


def make_plan_main(run_command: Callable[..., int], measurer):
  """(main, run_main) of a planning command: `run_main()` parses the flags
  (exit 2 on a bad one) and calls `main`, which applies the allocator
  policy and runs `run_command` (`overlap_core.planning.command.plan_main`
  or `burst_plan_main`) with the side's `measurer`."""
  from flags import plan as plan_flags  # pylint: disable=g-import-not-at-top
  tfo_flags.define_flags()
  plan_flags.define_flags()

  def main(argv):
    del argv
    config = tfo_flags.to_config(tfo_flags.FLAGS)
    # Layers are timed under the allocator policy the trainer runs with.
    host_allocator.apply(config.run.host_allocator)
    return run_command(tfo_flags.FLAGS, config, measurer,
                       usage_error=tfo_flags.exit_with_usage_error)

  def run_main():
    app.run(main, flags_parser=tfo_flags.parse_or_exit)

  return main, run_main
