"""The flag reference page is the output of its generator, not a copy."""

import os
import subprocess
import sys

from tests.docs import doc_commands


def test_the_flag_reference_is_generated_from_the_definitions():
  # In a process of its own: the generator defines every command's flags,
  # which no single entry point does.
  done = subprocess.run(
      [sys.executable, os.path.join("tools", "render_flag_reference.py"),
       "--check"], cwd=doc_commands.ROOT, capture_output=True, text=True,
      timeout=120, check=False,
      env=dict(os.environ, PYTHONPATH=doc_commands.ROOT))
  assert done.returncode == 0, done.stderr
