"""The framework-neutral core: ledger, trace, run record, report."""

import json
import subprocess
import sys
import types

import numpy as np
import pytest

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import summary as report
from overlap_core.runtime import run_record
from overlap_core.runtime import trace
from overlap_core.runtime import zoo
from overlap_core.runtime.cost_calibration import (CostCalibration,
                                             measure_iterations_per_ms)
from overlap_core.runtime.evaluation import evaluation_result
from overlap_core.runtime.loop_context import (LoopContext, ScalarWindows,
                                               after_execution, after_step)
from overlap_core.runtime.progress import ProgressPrinter

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


def test_cpu_time_is_kept_beside_wall_time_per_phase_and_step():
  """Each phase's CPU is what the clocks advanced while it lasted; the
  step's is the process tree's over the whole step, other time included."""
  clock, thread, process, tree = (FakeClock(), FakeClock(), FakeClock(),
                                  FakeClock())
  ledger = ledger_lib.StepLedger(clock=clock, cpu_clocks=ledger_lib.CpuClocks(
      thread=thread, process=process, tree=tree))

  def work(wall_s, thread_s, process_s, tree_s):
    for c, s in ((clock, wall_s), (thread, thread_s), (process, process_s),
                 (tree, tree_s)):
      c.advance(s)

  for step in range(1, 5):
    with ledger.phase(ledger_lib.DATA_WAIT):
      work(0.010, 0.001, 0.008, 0.012)  # input threads work while we wait
    with ledger.phase(ledger_lib.COMPUTE):
      work(0.020, 0.005, 0.030, 0.030)  # op threads on two cores
    ledger.add(ledger_lib.CHECKPOINT_STALL, clock(), clock())  # timed elsewhere
    work(0.010, 0.001, 0.002, 0.002)  # bookkeeping between steps
    ledger.end_step(step, num_samples=8)
  summary = ledger.summary(warmup_steps=0)
  phases = summary["phases"]
  assert phases["data_wait"]["cpu_mean"] == pytest.approx(0.008)
  assert phases["data_wait"]["thread_cpu_mean"] == pytest.approx(0.001)
  assert phases["compute"]["cpu_mean"] == pytest.approx(0.030)
  assert "cpu_mean" not in phases["checkpoint_stall"]
  assert phases["step"]["cpu_mean"] == pytest.approx(0.044)
  assert phases["step"]["thread_cpu_mean"] == pytest.approx(0.007)
  cpu = summary["cpu"]
  assert cpu["work_s_per_step"] == pytest.approx(0.044)
  assert cpu["busy_cores"] == pytest.approx(0.044 / 0.040)
  assert cpu["work_bound_s"] == pytest.approx(0.044 / cpu["cores"])


def test_phase_cpu_is_read_on_the_sampled_steps_only():
  """The CPU clocks are read on the first steps and one in 8 after; a
  phase's CPU is its mean over the measured steps that read it, and the
  step's own reading carries the steps since the one before."""
  clock = FakeClock()
  made = {}  # the ledger, once made: each read notes the step it is in
  reads, tree_reads = [], []

  def phase_clock():
    reads.append(len(made["ledger"].steps) if made else None)
    return clock()  # one busy thread: CPU = wall time

  def tree():
    tree_reads.append(len(made["ledger"].steps) if made else None)
    return clock()

  ledger = made["ledger"] = ledger_lib.StepLedger(
      clock=clock, cpu_clocks=ledger_lib.CpuClocks(
          thread=phase_clock, process=phase_clock, tree=tree))
  del reads[:], tree_reads[:]  # the constructor's reading
  num_steps = 40
  for step in range(1, num_steps + 1):
    # Steps that read wait 3 ms, the others 1 ms: the mean shows which
    # steps it came from.
    wait_s = 0.003 if ledger_lib.samples_phase_cpu(step - 1) else 0.001
    with ledger.phase(ledger_lib.DATA_WAIT):
      clock.advance(wait_s)
    with ledger.phase(ledger_lib.COMPUTE):
      clock.advance(0.010)
    ledger.end_step(step, num_samples=8)
  sampled = [i for i in range(num_steps) if ledger_lib.samples_phase_cpu(i)]
  assert sampled == list(range(16)) + [16, 24, 32]
  # Two phases, each read at both ends, by both clocks; the step's end
  # reads the thread clock too, and the tree's.
  expected = []
  for i in range(num_steps):
    expected += [i] * (9 if i in sampled else 0)
  assert reads == expected
  assert tree_reads == sampled
  phases = ledger.summary(warmup_steps=10)["phases"]
  assert phases["data_wait"]["cpu_mean"] == pytest.approx(0.003)
  assert phases["data_wait"]["thread_cpu_mean"] == pytest.approx(0.003)
  assert phases["compute"]["cpu_mean"] == pytest.approx(0.010)
  # The step's CPU is that of the measured steps the readings cover, up
  # to the last one (step index 32): 10 to 16 one each, then 8 each. Of
  # those 23, the 9 that read (10 to 16, 24, 32) waited 3 ms.
  assert phases["step"]["cpu_mean"] == pytest.approx(
      0.010 + (9 * 0.003 + 14 * 0.001) / 23)
  assert phases["step"]["thread_cpu_mean"] == pytest.approx(
      phases["step"]["cpu_mean"])
  covered = [r.cpu_steps for r in ledger.steps]
  assert covered[:17] == [1] * 17 and covered[24] == covered[32] == 8
  assert sum(covered) == 33 and not any(covered[33:])


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


def test_breakdown_table_says_when_contention_may_be_understated():
  summary = run_fake_steps(lambda step: {ledger_lib.COMPUTE: 0.01},
                           10).summary()
  assert "note:" not in report.format_breakdown(summary)
  summary["against_step_alone"] = {"steps": 9, "steps_below": 7,
                                   "median_excess_ms": -0.5}
  last = report.format_breakdown(summary).splitlines()[-1]
  assert last.startswith("  note: contention may be understated: the "
                         "steps' compute ran 0.50 ms below")


def test_breakdown_table_says_a_replicas_wait_may_save_less():
  # Each step waits 3 ms for input and computes 7 (the fake clock adds
  # 1 ms of other): data_wait is 27.3% of the step.
  summary = run_fake_steps(lambda step: {ledger_lib.DATA_WAIT: 0.003,
                                         ledger_lib.COMPUTE: 0.007},
                           10).summary()
  assert "note:" not in report.format_breakdown(summary)
  # A record whose replicas' waits were taken over the replicas.
  summary["strategy"] = {"phases_over_replicas": {}}
  last = report.format_breakdown(summary).splitlines()[-1]
  assert last.startswith("  note: data_wait is 27.3% of the step, the "
                         "slowest replica's wait")


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


def test_progress_of_a_loop_of_unknown_length_has_no_total(capsys):
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  printer = ProgressPrinter(total_steps=None, every_steps=2, enabled=True)
  for step in range(1, 4):
    with ledger.phase(ledger_lib.COMPUTE):
      clock.advance(0.5)
    ledger.end_step(step, num_samples=10)
    printer.maybe_print(ledger, step, loss=1.0)
  (line,) = capsys.readouterr().out.splitlines()
  assert line.startswith("step 2  loss 1.0000")
  assert line.endswith("ckpt  0.0%")  # no ETA without a total


class RecordingCheckpointer:
  """Due every `every` steps; each save takes `save_s` on the fake clock."""

  def __init__(self, clock, every, save_s):
    self.clock, self.every, self.save_s = clock, every, save_s
    self.saved = []
    self.asked = []

  def is_due(self, step):
    self.asked.append(step)
    return step % self.every == 0

  def save(self, step):
    self.clock.advance(self.save_s)
    self.saved.append(step)


def test_after_step_times_the_checkpoint_and_reports():
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  checkpointer = RecordingCheckpointer(clock, every=2, save_s=0.5)
  written = []
  ctx = LoopContext(
      ledger=ledger,
      progress=ProgressPrinter(total_steps=4, every_steps=2, enabled=False),
      checkpointer=checkpointer,
      write_scalars=lambda step, loss: written.append((step, loss)),
      first_step=1, last_step=4, global_batch_size=8)
  for step in range(ctx.first_step, ctx.last_step + 1):
    with ledger.phase(ledger_lib.COMPUTE):
      clock.advance(0.25)
    after_step(ctx, step, loss=float(step))
  assert checkpointer.saved == [2, 4]
  assert [s.step for s in ledger.steps] == [1, 2, 3, 4]
  stalls = [span for span in ledger.spans
            if span.name == ledger_lib.CHECKPOINT_STALL]
  assert [span.step for span in stalls] == [2, 4]
  assert [span.duration_s for span in stalls] == pytest.approx([0.5, 0.5])
  assert written == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


def test_a_multi_step_call_is_shared_out_and_checkpoints_at_its_end():
  """Two calls of 4 steps, 0.4 s each: every step gets 0.1 s in order, and
  the checkpointer is asked only after each call's last step, when the
  variables hold that step's state."""
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  checkpointer = RecordingCheckpointer(clock, every=4, save_s=0.5)
  ctx = LoopContext(
      ledger=ledger,
      progress=ProgressPrinter(total_steps=8, every_steps=4, enabled=False),
      checkpointer=checkpointer, write_scalars=lambda step, loss: None,
      first_step=1, last_step=8, global_batch_size=8)
  for first in (1, 5):
    start = clock()
    clock.advance(0.4)
    after_execution(ctx, first, [float(first + i) for i in range(4)],
                    start, clock())
  assert checkpointer.asked == [4, 8] and checkpointer.saved == [4, 8]
  steps = ledger.steps
  assert [s.step for s in steps] == list(range(1, 9))
  assert [s.phases_s[ledger_lib.COMPUTE] for s in steps] == pytest.approx(
      [0.1] * 8)
  # A call's last step also holds its checkpoint stall.
  assert [s.duration_s for s in steps] == pytest.approx(
      [0.1, 0.1, 0.1, 0.6] * 2)
  assert ledger.summary(warmup_steps=0)["phases"]["compute"]["p50"] == \
      pytest.approx(0.1)


def test_a_multi_step_call_puts_its_measured_wait_first_in_each_share():
  """A call of 4 steps over 0.4 s that waited 0.08 s for its batches in
  all: every step gets 0.02 s of data wait, then 0.08 s of compute. A wait
  longer than the call (two clocks) is capped at each share's length."""
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  ctx = LoopContext(
      ledger=ledger,
      progress=ProgressPrinter(total_steps=8, every_steps=4, enabled=False),
      checkpointer=None, write_scalars=lambda step, loss: None,
      first_step=1, last_step=8, global_batch_size=8)
  for first, wait_s in ((1, 0.08), (5, 0.5)):
    start = clock()
    clock.advance(0.4)
    after_execution(ctx, first, [0.0] * 4, start, clock(),
                    data_wait_s=wait_s)
  steps = ledger.steps
  assert [s.phases_s[ledger_lib.DATA_WAIT] for s in steps] == pytest.approx(
      [0.02] * 4 + [0.1] * 4)
  assert [s.phases_s.get(ledger_lib.COMPUTE, 0.0) for s in steps] == \
      pytest.approx([0.08] * 4 + [0.0] * 4)
  assert [s.duration_s for s in steps] == pytest.approx([0.1] * 8)
  waits = [span for span in ledger.spans if span.name == ledger_lib.DATA_WAIT]
  # Each wait opens its step's share.
  assert [w.start_s for w in waits[:4]] == pytest.approx(
      [100.0, 100.1, 100.2, 100.3])


def test_scalar_windows_cover_the_steps_since_the_last_report():
  clock = FakeClock()
  ledger = ledger_lib.StepLedger(clock=clock)
  windows = ScalarWindows(ledger, every_steps=2)
  reports = []
  for step in range(1, 5):
    with ledger.phase(ledger_lib.COMPUTE):
      clock.advance(0.1 * step)  # steps 3 and 4 are slower than 1 and 2
    ledger.end_step(step, num_samples=10)
    reports.append(windows.due(step))
  assert reports[0] is None and reports[2] is None
  # 20 samples in 0.3 s, then 20 in 0.7 s: each window only its own steps.
  assert reports[1]["samples_per_second"] == pytest.approx(20 / 0.3)
  assert reports[3]["samples_per_second"] == pytest.approx(20 / 0.7)


def test_evaluation_result_names_the_task_metric():
  assert evaluation_result(zoo.CLASSIFICATION, loss_sum=36.0,
                           quality_sum=351.0, count=360.0) == {
                               "eval_loss": 0.1, "eval_accuracy": 0.975,
                               "eval_examples": 360}
  assert evaluation_result(zoo.SUPER_RESOLUTION, loss_sum=2.0,
                           quality_sum=120.0, count=4.0) == {
                               "eval_loss": 0.5, "eval_psnr_db": 30.0,
                               "eval_examples": 4}
  assert evaluation_result(zoo.CLASSIFICATION, loss_sum=0.0,
                           quality_sum=0.0, count=0.0) == {}


def test_cost_calibration_measures_once_and_scales():
  calls = []

  def calibrate():
    calls.append(1)
    return 40.0  # rounds per ms

  calibration = CostCalibration(calibrate)
  assert calibration.iterations_for_cost(0.0) == 0
  assert not calls  # a zero cost needs no measurement
  assert calibration.iterations_for_cost(2.5) == 100
  assert calibration.iterations_for_cost(0.001) == 1  # never rounds to none
  assert calibration.iterations_per_ms() == 40.0
  assert len(calls) == 1
  with pytest.raises(ValueError, match="cost_ms=-1"):
    calibration.iterations_for_cost(-1)


def test_measured_rate_is_rounds_over_clock_time():
  clock = FakeClock()
  runs = []

  def run_probe(sample):
    runs.append(sample)
    clock.advance(0.25)  # 500 rounds in 250 ms

  rate = measure_iterations_per_ms(run_probe, probe_iterations=500,
                                   clock=clock, min_s=1.0, min_samples=3)
  assert rate == pytest.approx(2.0)
  assert runs == [0, 1, 2, 3]  # until a second had passed


def test_neutral_packages_import_no_framework():
  # Every module of the neutral core and of the flags, found on disk, so a
  # new one cannot slip by.
  code = ("import importlib, pkgutil, sys\n"
          "import flags, overlap_core\n"
          "names = [m.name for m in pkgutil.walk_packages(\n"
          "    overlap_core.__path__, 'overlap_core.')]\n"
          "assert len(names) >= 15, names\n"
          "for name in names:\n"
          "  importlib.import_module(name)\n"
          "bad = {'tensorflow', 'torch', 'keras', 'matplotlib'} & "
          "set(sys.modules)\n"
          "assert not bad, bad\n")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def test_collect_builders_finds_each_zoo_name_in_exactly_one_module():
  builders = {f"build_{name}": (lambda name=name: name)
              for name in zoo.MODEL_NAMES}
  first = types.SimpleNamespace(**dict(list(builders.items())[:3]))
  rest = types.SimpleNamespace(**dict(list(builders.items())[3:]))
  found = zoo.collect_builders((first, rest))
  assert tuple(found) == zoo.MODEL_NAMES
  assert [build() for build in found.values()] == list(zoo.MODEL_NAMES)
  with pytest.raises(ValueError, match="model 'mlp': 0 modules define"):
    zoo.collect_builders((rest,))
  with pytest.raises(ValueError, match="model 'mlp': 2 modules define"):
    zoo.collect_builders((first, first, rest))
