"""Runs one test file under pytest: the entry point of every Bazel py_test.

Bazel starts this file in the test's runfiles tree with the test file as its
argument (see tests/BUILD). Plain `python -m pytest` never runs it.
"""

import os
import sys

import pytest


def main(argv):
  args = list(argv) + [
      # The runfiles tree is not a place to leave a cache in.
      "-p", "no:cacheprovider",
      # Bazel already runs one file per test; no worker processes inside.
      "-n", "0",
  ]
  # Bazel names a private scratch directory and a results file per test.
  if "TEST_TMPDIR" in os.environ:
    args.append("--basetemp=" + os.path.join(os.environ["TEST_TMPDIR"],
                                             "pytest"))
  if "XML_OUTPUT_FILE" in os.environ:
    args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
  return pytest.main(args)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
