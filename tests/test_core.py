"""The framework-neutral core: ledger, trace, run record, report."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tfoverlap.core import ledger as ledger_lib
from tfoverlap.core import report, run_record, trace
from tfoverlap.core.progress import ProgressPrinter

from tests.helpers import REPO_ROOT


class FakeClock:
  """Advances only when told, so durations in tests are exact."""

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now

  def advance(self, seconds):
    self.now += seconds


def run_fake_steps(phase_costs, num_steps, clock=None):
  clock = clock or FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  for step in range(1, num_steps + 1):
    for name, cost in phase_costs(step).items():
      with ledger.phase(name):
        clock.advance(cost)
    clock.advance(0.001)  # bookkeeping outside any phase
    ledger.end_step(step, num_samples=32)
  return ledger


def test_summary_excludes_warmup_and_splits_phases():
  def costs(step):
    compute = 1.0 if step == 1 else 0.010  # step 1 traces the graph
    return {ledger_lib.DATA_WAIT: 0.002, ledger_lib.COMPUTE: compute}

  summary = run_fake_steps(costs, 20).summary()
  assert summary["warmup_steps"] == 2
  assert summary["measured_steps"] == 18
  phases = summary["phases"]
  assert phases["compute"]["mean"] == pytest.approx(0.010)
  assert phases["data_wait"]["p95"] == pytest.approx(0.002)
  assert phases["checkpoint_stall"]["total"] == 0.0
  assert phases["other"]["mean"] == pytest.approx(0.001)
  assert phases["step"]["mean"] == pytest.approx(0.013)
  assert phases["compute"]["fraction"] == pytest.approx(10 / 13)
  assert summary["samples_per_second"] == pytest.approx(32 / 0.013)


def test_time_between_steps_counts_as_other():
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  for step in (1, 2):
    with ledger.phase(ledger_lib.COMPUTE):
      clock.advance(0.010)
    ledger.end_step(step, num_samples=1)
    clock.advance(0.005)  # a progress line printed after the step closed
  first, second = ledger.steps
  assert first.duration_s == pytest.approx(0.010)
  assert second.start_s == first.end_s
  assert second.duration_s == pytest.approx(0.015)
  assert sum(r.duration_s for r in ledger.steps) == pytest.approx(
      second.end_s - first.start_s)


def test_percentiles_interpolate():
  values = sorted(float(v) for v in range(1, 101))
  assert ledger_lib.percentile(values, 50) == pytest.approx(50.5)
  assert ledger_lib.percentile(values, 95) == pytest.approx(95.05)
  assert np.isnan(ledger_lib.percentile([], 50))


def test_phases_added_from_callbacks_count_in_the_step():
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  ledger.add(ledger_lib.COMPUTE, clock.now, clock.now + 0.5)
  clock.advance(0.5)
  record = ledger.end_step(1, num_samples=8)
  assert record.duration_s == pytest.approx(0.5)
  assert record.phases_s == {ledger_lib.COMPUTE: pytest.approx(0.5)}


def test_trace_nests_phases_inside_steps(tmp_path):
  ledger = run_fake_steps(
      lambda step: {ledger_lib.DATA_WAIT: 0.002, ledger_lib.COMPUTE: 0.01}, 3)
  path = trace.write_chrome_trace(str(tmp_path / "trace.json"), ledger.spans,
                                  origin_s=ledger.origin_s, pid=1)
  events = trace.load_trace(path)["traceEvents"]
  slices = [e for e in events if e["ph"] == "X"]
  assert len(slices) == 3 * 3  # step + two phases, three steps
  steps = [e for e in slices if e["name"] == "step"]
  for step_event in steps:
    inner = [e for e in slices if e["args"]["step"] == step_event["args"]
             ["step"] and e["name"] != "step"]
    for e in inner:
      assert step_event["ts"] <= e["ts"]
      assert e["ts"] + e["dur"] <= step_event["ts"] + step_event["dur"] + 1e-3
  assert {e["pid"] for e in events} == {1}
  assert steps[0]["dur"] == pytest.approx(13000, abs=0.01)


def test_weights_digest_sees_every_bit():
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  b = a.copy()
  b.view(np.uint32)[1, 1] ^= 1  # flip the lowest mantissa bit
  assert run_record.digest_weights([("w", a)]) == run_record.digest_weights(
      [("w", a.copy())])
  assert run_record.digest_weights([("w", a)]) != run_record.digest_weights(
      [("w", b)])
  assert run_record.digest_weights([("w", a)]) != run_record.digest_weights(
      [("v", a)])


def test_json_is_written_atomically(tmp_path):
  path = tmp_path / "run.json"
  run_record.write_json_atomically(str(path), {"a": np.float32(1.5)})
  assert json.loads(path.read_text()) == {"a": 1.5}
  with pytest.raises(TypeError):
    run_record.write_json_atomically(str(path), {"a": object()})
  assert json.loads(path.read_text()) == {"a": 1.5}  # the old file survives
  assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_breakdown_table_marks_unmeasured_phases():
  summary = run_fake_steps(lambda step: {ledger_lib.COMPUTE: 0.01},
                           10).summary()
  table = report.format_breakdown(summary, phases_measured=["compute"])
  rows = {line.split()[0]: line for line in table.splitlines()[2:]}
  assert "n/a" in rows["data_wait"]
  assert "10.000" in rows["compute"]
  assert "100.0%" in rows["step"]


def test_progress_prints_on_cadence(capsys):
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  printer = ProgressPrinter(total_steps=5, every_steps=2, enabled=True)
  printed = []
  for step in range(1, 6):
    with ledger.phase(ledger_lib.COMPUTE):
      clock.advance(0.5)
    ledger.end_step(step, num_samples=10)
    printed.append(printer.maybe_print(ledger, step, loss=1.0 / step))
  assert printed == [False, True, False, True, True]  # and the last step
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith("step 2/5  loss 0.5000")
  assert "20.0 samples/s" in lines[0]
  assert "compute 100.0%" in lines[0]


def test_core_imports_no_framework():
  # Every module of the core, found on disk, so a new one cannot slip by.
  code = ("import importlib, pkgutil, sys\n"
          "import flags, tfoverlap.core as core\n"
          "names = [m.name for m in pkgutil.iter_modules(core.__path__)]\n"
          "assert len(names) >= 10, names\n"
          "for name in names:\n"
          "  importlib.import_module('tfoverlap.core.' + name)\n"
          "bad = {'tensorflow', 'torch', 'keras'} & set(sys.modules)\n"
          "assert not bad, bad\n")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)
