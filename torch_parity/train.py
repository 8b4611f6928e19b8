"""python -m torch_parity.train: the measured PyTorch trainer.

The same flags as `python -m tfoverlap.train`, with the same meanings; a
value with no PyTorch meaning (`--loop=fit`, `--data_service`, ...) exits 2
with one line saying why. With no flags it trains the small CNN on the
embedded digits set under `--strategy=mirrored`: DDP over two local
processes, which this command starts itself. Under torchrun,
`torch_parity.launch` or horovodrun it is one rank of their world.
"""

import sys

import flags as tfo_flags
from flags import entry_point

tfo_flags.define_flags()
PROGRAM = "torch_parity.train"


def _train(config):
  # pylint: disable=g-import-not-at-top
  from overlap_core.runtime import user_code
  from torch_parity import distribute, launch, trainer
  trainer.check_supported(config)
  # Before any replica starts: the user's module imports, or exit 2 now.
  user_code.check_importable(config.model.name, config.data.dataset)
  if (config.distribute.strategy == "mirrored" and
      config.distribute.num_devices > 1 and not distribute.is_launched()):
    trainer.check_user_model(config)
    # One process per replica, as DDP needs; this process supervises.
    sys.exit(launch.launch_replicas(config.distribute.num_devices,
                                    sys.argv[1:], program=PROGRAM))
  return trainer.train(config)


def _runtime_errors():
  from overlap_core.checkpoint.files import CheckpointError  # pylint: disable=g-import-not-at-top
  # A lost peer (torch.distributed's errors are RuntimeErrors, and so is
  # CheckpointError), an exhausted device or a full disk.
  return (RuntimeError, OSError, CheckpointError)


main, run_main = entry_point.make_trainer_main(
    PROGRAM, "pytorch", _train, _runtime_errors)

if __name__ == "__main__":
  run_main()
