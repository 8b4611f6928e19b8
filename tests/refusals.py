"""A trainer's refusal of its flags: asked in-process, or read off a command.

Starting a trainer costs a framework import (10 s or more here) per case,
so a test file proves the command-line path once per framework with
`usage_error_line(run_module(...))` and asks every other case of
`trainer_refusal`, which runs the same checks without a process:

  assert "--loop=fit" in trainer_refusal("torch_parity.train",
                                         ["--loop=fit"])
"""

import importlib
import os
import subprocess
from typing import Sequence

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime.config import ConfigError

from tests.helpers import REPO_ROOT

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()

# Each entry point's train() calls its trainer's check_supported before it
# builds anything (torch_parity.train before it starts a replica).
TRAINER_CHECKS = {"tfoverlap.train": "tfoverlap.trainer",
                  "torch_parity.train": "torch_parity.trainer"}


def usage_error_line(result: subprocess.CompletedProcess) -> str:
  """The one error line of a command that must have exited 2."""
  assert result.returncode == 2, result.stderr
  # TensorFlow's own start-up log lines may come first; ours is one line.
  errors = [l for l in result.stderr.splitlines() if ": error: " in l]
  assert len(errors) == 1, result.stderr
  assert "Traceback" not in result.stderr
  return errors[0]


def trainer_refusal(program: str, args: Sequence[str]) -> str:
  """What `python -m program args` refuses with exit 2, asked in-process.

  The flags become a config as the entry point's parser makes it (which
  refuses what the flags alone rule out), then the trainer's own check
  judges it; relative paths are read from the repository root, as
  `run_module` runs commands there.

  Returns:
    The refusal's text, asserted to be one line.
  """
  parsed = dict(arg[len("--"):].split("=", 1) for arg in args)
  trainer = importlib.import_module(TRAINER_CHECKS[program])
  cwd = os.getcwd()
  os.chdir(REPO_ROOT)
  try:
    with pytest.raises(ConfigError) as raised:
      with flagsaver.as_parsed(**parsed):
        config = tfo_flags.to_config()
      trainer.check_supported(config)
  finally:
    os.chdir(cwd)
  message = str(raised.value)
  assert "\n" not in message, message
  return message
