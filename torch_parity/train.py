"""python -m torch_parity.train: the measured PyTorch trainer.

The same flags as `python -m tfoverlap.train`, with the same meanings; a
value with no PyTorch meaning (`--loop=fit`, `--data_service`, ...) exits 2
with one line saying why. With no flags it trains the small CNN on the
embedded digits set under `--strategy=mirrored`: DDP over two local
processes, which this command starts itself. Under torchrun,
`torch_parity.launch` or horovodrun it is one rank of their world.
"""

import sys

from absl import app
from absl import logging

import flags as tfo_flags
from overlap_core.runtime.config import ConfigError

tfo_flags.define_flags()
PROGRAM = "torch_parity.train"


def main(argv):
  del argv  # parse_or_exit refuses positional arguments
  config = tfo_flags.to_config(tfo_flags.FLAGS)
  if not tfo_flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  # torch is imported only now, after flags parsed, so --helpfull and a bad
  # flag answer at once.
  from overlap_core.runtime import failure, summary as report, waits
  from torch_parity import distribute  # pylint: disable=g-import-not-at-top
  from torch_parity import launch  # pylint: disable=g-import-not-at-top
  from torch_parity import trainer  # pylint: disable=g-import-not-at-top
  try:
    trainer.check_supported(config)
    if (config.distribute.strategy == "mirrored" and
        config.distribute.num_devices > 1 and not distribute.is_launched()):
      # One process per replica, as DDP needs; this process supervises.
      sys.exit(launch.launch_replicas(config.distribute.num_devices,
                                      sys.argv[1:], program=PROGRAM))
    record = trainer.train(config)
  except ConfigError as e:
    tfo_flags.exit_with_usage_error(str(e))
  except (RuntimeError, OSError) as e:
    # A lost peer (torch.distributed's errors are RuntimeErrors), an
    # exhausted device or a full disk: one line for the user; the traceback
    # stays available with --verbosity=1.
    logging.debug("training failed", exc_info=True)
    failure.record_failure(config, e, framework="pytorch")
    tfo_flags.exit_with_runtime_error(PROGRAM, waits.explain(e))
  if record is not None and record["worker"]["index"] == 0:
    print(report.format_breakdown(record,
                                  phases_measured=record["phases_measured"]))
    print(report.format_final(record))


def run_main():
  app.run(main, argv=sys.argv, flags_parser=tfo_flags.parse_or_exit)


if __name__ == "__main__":
  run_main()
