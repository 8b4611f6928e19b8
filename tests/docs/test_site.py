"""The manual builds without a broken link, and the README is its front door."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.docs import doc_commands

ROOT = doc_commands.ROOT


def _read(*path):
  with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
    return f.read()


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None
                    or importlib.util.find_spec("material") is None,
                    reason="mkdocs and mkdocs-material are not installed: "
                           'pip install ".[docs]"')
def test_the_site_builds_strictly(tmp_path):
  # --strict turns every warning into a failure: a link to a missing page or
  # anchor, a page left out of the nav.
  done = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
       "--site-dir", str(tmp_path / "site")],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
  assert done.returncode == 0, done.stdout + done.stderr
  assert (tmp_path / "site" / "reference" / "flags" / "index.html").exists()


def test_the_readme_is_a_front_door():
  readme = _read("README.md")
  assert len(readme.splitlines()) <= 200
  # Its table of pages points at pages that exist.
  pages = re.findall(r"\]\((docs/[^)#]+\.md)", readme)
  assert len(pages) >= 10, pages
  missing = [p for p in pages if not os.path.exists(os.path.join(ROOT, p))]
  assert missing == []


def _readme_test_command() -> str:
  readme = _read("README.md")
  commands = [line for line in readme.splitlines()
              if line.startswith("python3 -m venv") and "pytest" in line]
  assert len(commands) == 1, commands
  return commands[0]


def test_ci_runs_the_readme_test_command():
  command = _readme_test_command()
  # After the environment is made and activated, .ci/run runs the same
  # commands, one a line, so that `set -e` ends it at the first that
  # fails; it only adds --quiet to pip.
  steps = command.split(" && ")
  assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]
  ci = _read(".ci", "run").replace("pip install --quiet ", "pip install ")
  lines = ci.splitlines()
  rest = steps[2:]
  assert any(lines[i:i + len(rest)] == rest for i in range(len(lines))), rest


def test_the_test_command_installs_the_docs_extra():
  # Otherwise test_the_site_builds_strictly would be skipped on CI.
  extras = re.search(r'pip install "\.\[([a-z,]+)\]"', _readme_test_command())
  assert extras and "docs" in extras.group(1).split(",")
