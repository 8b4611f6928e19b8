"""Runs one campaign part and writes its results file.

Each command is a child process (`python -m module`), as the drivers run
when started by hand; the part's deadline bounds them all, and a command
that would pass it is killed with its process group and recorded as timed
out. The part's file holds the environment, every command line, its exit
status, time, the end of its output and the result the driver wrote.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

from benchmarks import common
from benchmarks.gpu_campaign import parts

_OUTPUT_TAIL_CHARS = 4000
# The package an importable name comes from, for the line that asks for it.
_PIP_NAMES = {"absl": "absl-py", "pytest": "pytest"}


def missing_requirements(part: parts.Part) -> list:
  """The pip packages `part` needs that this Python cannot import."""
  return [_PIP_NAMES.get(name, name) for name in part.requires
          if importlib.util.find_spec(name) is None]


def read_junit(path: str) -> dict:
  """pytest's junit XML as counts and one record per test."""
  root = ElementTree.parse(path).getroot()
  suites = [root] if root.tag == "testsuite" else list(root)
  cases = []
  for suite in suites:
    for case in suite.iter("testcase"):
      outcome, message = "passed", None
      for child in case:
        if child.tag in ("failure", "error", "skipped"):
          outcome = {"failure": "failed", "error": "error",
                     "skipped": "skipped"}[child.tag]
          message = (child.get("message") or "")[:_OUTPUT_TAIL_CHARS]
      cases.append({"test": f"{case.get('classname')}::{case.get('name')}",
                    "time_s": float(case.get("time") or 0.0),
                    "outcome": outcome, "message": message})
  counts = {}
  for case in cases:
    counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
  return {"counts": counts, "tests": cases}


_READERS = {"json": lambda path: json.load(open(path, encoding="utf-8")),
            "junit": read_junit}


def _run_command(argv: list, timeout_s: float, env: dict) -> dict:
  start = time.perf_counter()
  # A session of its own: a timed-out driver's children go with it.
  process = subprocess.Popen([sys.executable, *argv], cwd=common.REPO_ROOT,
                             env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
  try:
    output, _ = process.communicate(timeout=max(1.0, timeout_s))
    timed_out = False
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate()
    timed_out = True
  return {"returncode": process.returncode, "timed_out": timed_out,
          "wall_s": time.perf_counter() - start,
          "output_tail": output[-_OUTPUT_TAIL_CHARS:]}


def run_part(part: parts.Part, *, results_dir: str, dry_run: bool,
             environment: dict, env: dict, log=common.log) -> dict:
  """Runs `part` (in a dry run its first command, tiny) and writes
  <results_dir>/<part>.json; returns what it wrote."""
  start = time.perf_counter()
  deadline = start + 60 * parts.PART_LIMIT_MIN
  rows = []
  missing = missing_requirements(part)
  with tempfile.TemporaryDirectory(prefix=f"campaign-{part.name}-") as scratch:
    for index, command in enumerate(part.commands):
      _, extension = parts.OUTPUT_FLAGS[command.output]
      output_path = os.path.join(scratch, command.label + extension)
      argv = parts.command_line(command, output_path, dry_run=dry_run)
      row = {"label": command.label, "command": " ".join(["python", *argv])}
      rows.append(row)
      if missing:
        row["status"] = "not run: needs " + ", ".join(missing)
        continue
      if dry_run and (index > 0 or command.dry_args is None):
        row["status"] = ("built, not run: needs CUDA"
                         if command.dry_args is None else
                         "built, not run: a dry run runs a part's first "
                         "command")
        continue
      log(f"{part.name}/{command.label}: {row['command']}")
      row.update(_run_command(argv, deadline - time.perf_counter(), env))
      if row["timed_out"]:
        row["status"] = (f"timed out: the part passed its "
                         f"{parts.PART_LIMIT_MIN:g} minutes")
      elif row["returncode"] != 0 and not (
          command.output == "junit" and os.path.exists(output_path)):
        row["status"] = f"failed: exit {row['returncode']}"
      else:
        row["status"] = "ran"
      if os.path.exists(output_path):
        row["result"] = _READERS[command.output](output_path)
      if command.output == "junit" and row.get("result"):
        failed = sum(row["result"]["counts"].get(k, 0)
                     for k in ("failed", "error"))
        if failed:
          row["status"] = f"failed: {failed} test(s) failed"
      log(f"{part.name}/{command.label}: {row['status']} in "
          f"{row['wall_s']:.0f} s")
  statuses = [r["status"] for r in rows]
  payload = {
      "campaign_part": part.name, "dry_run": dry_run, "goal": part.goal,
      "expected_minutes": part.minutes, "models": list(part.models),
      "notes": list(part.notes), "environment": environment,
      "commands": rows, "wall_s": time.perf_counter() - start,
      "ok": not any(s.startswith(("failed", "timed out", "not run"))
                    for s in statuses)}
  common.write_results(os.path.join(results_dir, f"{part.name}.json"),
                       payload)
  return payload
