"""The user's own model and data through a trainer's command line, as both
sides' test_user_model.py run it: the flags read in-process, one short run,
one refused run.

  config = user_runs.config_of("torch_parity.train", "--model=pkg.mod:build")
"""

import json
import os
from typing import Sequence

from absl.testing import flagsaver

import flags as tfo_flags

from tests.helpers import run_module
from tests.refusals import usage_error_line

tfo_flags.define_flags()
# As short as shows what a user's model did: 3 steps of 8 examples.
SMALL = ("--train_steps=3", "--batch_size=8", "--log_every_steps=10")


def config_of(program: str, *args: str):
  """The TrainConfig `python -m program args...` builds from its flags."""
  with flagsaver.flagsaver():
    tfo_flags.FLAGS.unparse_flags()
    tfo_flags.FLAGS([program, *args])
    return tfo_flags.to_config()


def train_record(program: str, model_dir, *args: str) -> dict:
  """The run record of a SMALL run of `program` with `args`, which must
  succeed."""
  result = run_module(program, *args, f"--model_dir={model_dir}", *SMALL)
  assert result.returncode == 0, result.stderr
  with open(os.path.join(model_dir, "run.json"), encoding="utf-8") as f:
    return json.load(f)


def check_refused(program: str, tmp_path, args: Sequence[str], flag: str,
                  says: str):
  """A SMALL run of `program` with `args` exits 2 with one line that names
  `flag` and `says` why.

  Returns:
    Its model directory (tmp_path/run), for what the side says it holds.
  """
  model_dir = tmp_path / "run"
  line = usage_error_line(run_module(
      program, *args, f"--model_dir={model_dir}", *SMALL))
  assert f"error: {flag}=" in line and says in line, line
  return model_dir
