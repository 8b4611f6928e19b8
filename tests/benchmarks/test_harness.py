"""The benchmark harness's arithmetic, on synthetic numbers (no timing)."""

import argparse
import json

import pytest

from benchmarks import common
from benchmarks import harness


def test_each_repeat_starts_at_the_next_side():
  orders = [harness.interleaved_order(["a", "b", "c"], r) for r in range(4)]
  assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                    ["a", "b", "c"]]


def test_over_as_many_repeats_as_sides_every_side_takes_every_position():
  sides = [("k0", "off"), ("k0", "on"), ("k1", "off"), ("k1", "on")]
  orders = [harness.interleaved_order(sides, r) for r in range(len(sides))]
  for position in range(len(sides)):
    assert sorted(o[position] for o in orders) == sorted(sides)


@pytest.mark.parametrize("sides,repeat,message", [
    ([], 0, "at least one"), (["a", "a"], 0, "twice"), (["a"], -1, ">= 0")])
def test_bad_interleaving_arguments_say_what_is_wrong(sides, repeat, message):
  with pytest.raises(ValueError, match=message):
    harness.interleaved_order(sides, repeat)


def test_run_interleaved_runs_abab_and_records_the_host():
  calls = []

  def run_side(side, repeat):
    calls.append((side, repeat))
    return {"side": side, "repeat": repeat, "value": len(calls)}

  record = harness.run_interleaved(["a", "b"], 3, run_side, warn=lambda _: 0)
  assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2),
                   ("b", 2)]
  assert record["order"] == [["a", "b"], ["b", "a"], ["a", "b"]]
  assert [r["value"] for r in record["runs"]] == [1, 2, 3, 4, 5, 6]
  host = record["host"]
  assert len(host["host_by_repeat"]) == 3
  assert host["num_cores"] >= 1
  assert isinstance(host["busy"], bool)
  assert harness.values_by_side(record["runs"], "value") == {
      "a": [1, 4, 5], "b": [2, 3, 6]}


def test_run_interleaved_refuses_zero_repeats():
  with pytest.raises(ValueError, match="repeats: got 0"):
    harness.run_interleaved(["a"], 0, lambda side, repeat: {})


def _snapshot(load, host_cpu_s, self_cpu_s, at_s):
  return {"load_average": [load, load, load], "host_busy_cpu_s": host_cpu_s,
          "self_tree_cpu_s": self_cpu_s, "monotonic_s": at_s}


def test_foreign_cpu_is_host_cpu_minus_this_process_tree():
  # 100 s on 2 cores; the host was busy 130 s, 100 of them ours: 30 s is
  # other processes', 15% of the capacity, above the 10% line.
  load = harness.host_load(_snapshot(0.2, 1000.0, 50.0, 0.0),
                           _snapshot(1.9, 1130.0, 150.0, 100.0), num_cores=2)
  assert load["foreign_cpu_s"] == pytest.approx(30.0)
  assert load["foreign_cpu_frac"] == pytest.approx(0.15)
  assert load["busy"] and "other processes used 30.0 s" in load["warnings"][0]
  assert load["load_average_before"][0] == 0.2
  assert load["load_average_after"][0] == 1.9


def test_a_quiet_host_is_not_busy_and_a_loaded_one_is():
  quiet = harness.host_load(_snapshot(0.9, 0.0, 0.0, 0.0),
                            _snapshot(0.9, 101.0, 100.0, 100.0), num_cores=2)
  assert not quiet["busy"] and quiet["warnings"] == []
  loaded = harness.host_load(_snapshot(7.4, 0.0, 0.0, 0.0),
                             _snapshot(7.4, 100.0, 100.0, 100.0), num_cores=2)
  assert loaded["busy"]
  assert "load average 7.40" in loaded["warnings"][0]


def test_cpu_the_hypervisor_took_makes_a_run_busy():
  # 100 s on 2 cores with nothing else running here, but 25 s of steal:
  # 12.5% of the capacity, above the 10% line.
  before = dict(_snapshot(0.5, 0.0, 0.0, 0.0), host_steal_cpu_s=40.0)
  after = dict(_snapshot(0.5, 100.0, 100.0, 100.0), host_steal_cpu_s=65.0)
  load = harness.host_load(before, after, num_cores=2)
  assert load["steal_s"] == pytest.approx(25.0)
  assert load["steal_frac"] == pytest.approx(0.125)
  assert load["busy"]
  assert "hypervisor took 25.0 s of CPU (steal)" in load["warnings"][0]
  # 15 s of steal is 7.5%: not busy. Snapshots without the counter (files
  # from before it was read) judge nothing by it.
  after["host_steal_cpu_s"] = 55.0
  assert not harness.host_load(before, after, num_cores=2)["busy"]
  assert harness.host_load(_snapshot(0.5, 0.0, 0.0, 0.0),
                           _snapshot(0.5, 100.0, 100.0, 100.0),
                           num_cores=2)["steal_s"] is None


def _snapshots_with_steal(steal_per_span_s):
  """Host snapshots 100 s apart on 2 cores, nothing else running, with the
  given steal between each snapshot and the next."""
  steal_s = [0.0]
  for span_s in steal_per_span_s:
    steal_s.append(steal_s[-1] + span_s)
  taken = []

  def snapshot():
    at_s = 100.0 * len(taken)
    taken.append(at_s)
    return dict(_snapshot(0.5, at_s, at_s, at_s),
                host_steal_cpu_s=steal_s[len(taken) - 1])
  return snapshot


def test_busy_repeats_run_again_within_the_redo_budget():
  # Spans between snapshots: start -> repeat 0 -> its end -> the redo ->
  # its end -> repeat 1 -> its end -> the end. Repeat 0 loses 40 s of its
  # 200 core-seconds (20%) to steal, its redo 2 s; repeat 1 is quiet.
  snapshot = _snapshots_with_steal([0, 40, 0, 2, 0, 0, 0])
  calls, warned = [], []

  def run_side(side, repeat):
    calls.append((side, repeat))
    return {"side": side, "repeat": repeat, "call": len(calls)}

  record = harness.run_interleaved(["a", "b"], 2, run_side, redo_busy=2,
                                   warn=warned.append, snapshot=snapshot)
  assert calls == [("a", 0), ("b", 0), ("a", 0), ("b", 0), ("b", 1),
                   ("a", 1)]
  assert [r["call"] for r in record["runs"]] == [3, 4, 5, 6]
  discarded = record["host"]["discarded_repeats"]
  assert len(discarded) == 1 and discarded[0]["repeat"] == 0
  assert [r["call"] for r in discarded[0]["runs"]] == [1, 2]
  assert discarded[0]["host"]["steal_frac"] == pytest.approx(0.2)
  assert record["host"]["busy_repeats"] == []
  assert any("runs again (1 of 2" in line for line in warned)


def test_without_a_redo_budget_a_busy_repeat_is_kept_and_marked():
  snapshot = _snapshots_with_steal([0, 40, 0, 0, 0])
  record = harness.run_interleaved(
      ["a", "b"], 2, lambda side, repeat: {"side": side, "repeat": repeat},
      warn=lambda _: 0, snapshot=snapshot)
  assert record["host"]["discarded_repeats"] == []
  assert len(record["runs"]) == 4
  assert record["host"]["busy_repeats"] == [0] and record["host"]["busy"]
  with pytest.raises(ValueError, match="redo_busy: got -1"):
    harness.run_interleaved(["a"], 1, lambda side, repeat: {},
                            redo_busy=-1)


def test_a_later_group_does_not_judge_the_load_the_first_one_left():
  # Load 7.4 on 2 cores at the start: busy for a benchmark's first group,
  # not judged for a later one, which starts under the earlier one's load.
  def run_group(judge_start_load):
    quiet = _snapshots_with_steal([0, 0, 0])

    def loaded():
      return dict(quiet(), load_average=[7.4, 7.4, 7.4])
    return harness.run_interleaved(["a"], 1, lambda side, repeat: {},
                                   judge_start_load=judge_start_load,
                                   warn=lambda _: 0, snapshot=loaded)

  assert run_group(True)["host"]["busy"]
  assert not run_group(False)["host"]["busy"]


def test_foreign_cpu_is_unknown_without_proc_stat():
  load = harness.host_load(_snapshot(0.0, None, 0.0, 0.0),
                           _snapshot(0.0, None, 5.0, 10.0), num_cores=2)
  assert load["foreign_cpu_s"] is None and not load["busy"]


def test_five_repeats_give_the_range_at_93_75_percent():
  summary = harness.median_interval([1.05, 0.97, 1.01, 1.00, 0.99])
  assert summary["median"] == 1.00
  assert (summary["low"], summary["high"]) == (0.97, 1.05)
  # 1 - 2 * 0.5**5: the range misses the median only if all 5 fall on one
  # side of it.
  assert summary["confidence"] == pytest.approx(0.9375)


def test_nine_repeats_drop_one_value_at_each_end():
  values = [9, 1, 8, 2, 7, 3, 6, 4, 5]
  summary = harness.median_interval(values, confidence=0.90)
  # k = 2: coverage 1 - 2 * (1 + 9) / 512 = 0.9609 >= 0.90; k = 3 gives
  # 1 - 2 * 46 / 512 = 0.820, too little.
  assert (summary["low"], summary["high"]) == (2, 8)
  assert summary["confidence"] == pytest.approx(1 - 20 / 512)
  assert summary["median"] == 5


def test_an_even_count_takes_the_middle_pair_for_the_median():
  assert harness.median_interval([1, 2, 3, 10])["median"] == 2.5


def test_three_repeats_have_no_interval_at_90_percent():
  summary = harness.median_interval([1.0, 1.01, 1.02])
  assert summary["low"] is None and summary["high"] is None
  assert harness.verdict(summary, 1.5) == harness.NOISY


@pytest.mark.parametrize("values,confidence,message", [
    ([], 0.9, "at least one"), ([1.0, float("nan")], 0.9, "NaN"),
    ([1.0], 1.0, "0 < c < 1")])
def test_bad_interval_arguments_say_what_is_wrong(values, confidence,
                                                  message):
  with pytest.raises(ValueError, match=message):
    harness.median_interval(values, confidence)


def test_ratios_are_paired_by_repeat_and_missing_repeats_drop():
  summary = harness.summarize_ratios([110, None, 90, 100, 105, 99],
                                     [100, 100, 100, 100, 100, 100])
  assert summary["per_repeat"] == pytest.approx([1.1, 0.9, 1.0, 1.05, 0.99])
  assert summary["median"] == pytest.approx(1.0)
  with pytest.raises(ValueError, match="denominator is 0"):
    harness.paired_ratios([1.0], [0.0])
  with pytest.raises(ValueError, match="pair by repeat"):
    harness.paired_ratios([1.0, 2.0], [1.0])


@pytest.mark.parametrize("low,high,direction,expected", [
    (0.98, 1.01, harness.AT_MOST, harness.MET),
    (0.98, 1.02, harness.AT_MOST, harness.MET),     # the bound itself is met
    (1.03, 1.10, harness.AT_MOST, harness.MISSED),
    (0.99, 1.05, harness.AT_MOST, harness.NOISY),   # crosses the target
    (0.92, 0.97, harness.AT_LEAST, harness.MET),
    (0.80, 0.88, harness.AT_LEAST, harness.MISSED),
    (0.85, 0.95, harness.AT_LEAST, harness.NOISY),
])
def test_verdicts_follow_the_interval_not_the_median(low, high, direction,
                                                     expected):
  target = 1.02 if direction == harness.AT_MOST else 0.9
  summary = {"median": (low + high) / 2, "low": low, "high": high, "n": 5,
             "confidence": 0.9375}
  assert harness.verdict(summary, target, direction) == expected


def test_unknown_direction_is_refused():
  with pytest.raises(ValueError, match="direction: got 'below'"):
    harness.verdict({"low": 1, "high": 1}, 1.0, "below")


def test_prose_and_json_carry_the_same_verdict():
  summary = harness.summarize_ratios([101, 103, 99, 104, 102],
                                     [100, 100, 100, 100, 100])
  judged = harness.judge(summary, 1.02)
  assert judged["verdict"] == harness.NOISY
  assert harness.describe(judged) == (
      "noisy: 1.020 [0.990, 1.040] (94%), target at most 1.02")
  # A stored verdict that disagrees with its interval is not repeated.
  tampered = dict(judged, verdict=harness.MET)
  assert harness.describe(tampered).startswith("noisy")


def test_within_a_run_the_load_average_is_ours_and_not_judged():
  # Between repeats the benchmark's own processes hold the load up; only
  # the foreign CPU can say that others were busy then.
  during = harness.host_load(_snapshot(2.5, 0.0, 0.0, 0.0),
                             _snapshot(2.5, 100.0, 100.0, 100.0),
                             num_cores=2, check_load=False)
  assert not during["busy"]


def test_a_span_shorter_than_a_second_is_not_judged_by_its_cpu_share():
  # Two clock ticks of someone else's work in 5 ms would read as 200%.
  short = harness.host_load(_snapshot(0.0, 0.0, 0.0, 0.0),
                            _snapshot(0.0, 0.02, 0.0, 0.005), num_cores=2)
  assert short["foreign_cpu_s"] == pytest.approx(0.02)
  assert short["foreign_cpu_frac"] is None and not short["busy"]


def _driver_args(*argv):
  parser = argparse.ArgumentParser()
  common.add_common_args(parser, repeats=3, resummarize=True)
  return parser.parse_args(list(argv))


def _count_runs(payload):
  return {"num_runs": len(payload["runs"])}


def test_main_writes_what_every_results_file_records(tmp_path, capsys):
  path = tmp_path / "result.json"
  seen = []

  def measure(repeats, scratch):
    seen.append((repeats, scratch))
    record = harness.run_interleaved(
        ["a", "b"], repeats,
        lambda side, repeat: {"side": side, "repeat": repeat})
    return harness.Measured.of_group(record, sides=["a", "b"])

  harness.main("toy", _driver_args(f"--output={path}", "--repeats=2"),
               measure, default_repeats=3, summarize=_count_runs,
               table=lambda payload: f"table of {payload['benchmark']}")
  payload = json.loads(path.read_text())
  assert seen[0][0] == 2
  assert payload["benchmark"] == "toy" and payload["repeats"] == 2
  assert payload["summary"] == {"num_runs": 4}
  assert payload["sides"] == ["a", "b"] and len(payload["runs"]) == 4
  assert payload["machine"]["cpu_count"] and "command" in payload
  assert "all" in payload["harness"]["host"]
  out = capsys.readouterr().out
  assert out.startswith("table of toy\n") and "4 runs in" in out
  # The scratch directory is the driver's for the run only.
  assert not (tmp_path / seen[0][1]).exists()


def test_resummarize_rewrites_only_the_summary_and_runs_nothing(tmp_path,
                                                                 capsys):
  path = tmp_path / "result.json"
  path.write_text(json.dumps({"runs": [{}, {}, {}], "summary": "stale",
                              "repeats": 3}))

  def measure(repeats, scratch):
    raise AssertionError("--resummarize must not run the benchmark")

  harness.main("toy", _driver_args(f"--resummarize={path}"), measure,
               default_repeats=3, summarize=_count_runs,
               table=lambda payload: str(payload["summary"]["num_runs"]))
  assert json.loads(path.read_text()) == {
      "runs": [{}, {}, {}], "summary": {"num_runs": 3}, "repeats": 3}
  assert capsys.readouterr().out == "3\n"


# A child that burns this much CPU, then waits to be told to exit.
_SPIN_CPU_S = 0.3
_SPINNER = f"""
import sys, time
while time.process_time() < {_SPIN_CPU_S}:
  pass
print("spun", flush=True)
sys.stdin.read()
"""


def test_a_live_child_counts_as_this_process_tree_not_as_foreign_cpu():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  before = harness.host_snapshot()
  child = subprocess.Popen([sys.executable, "-c", _SPINNER],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
  try:
    # Read once the child says it spent its CPU, still running.
    assert child.stdout.readline() == "spun\n"
    live_s = common.live_children_cpu_s()
    after = harness.host_snapshot()
  finally:
    child.stdin.close()
    child.wait(timeout=60)
  # /proc counts whole 10 ms ticks of user and of system time, each read
  # rounding down, and the kernel charges ticks by sampling: a few ticks
  # below what the child's own clock read, never more than its interpreter
  # start-up above it (well under a second of CPU).
  assert _SPIN_CPU_S - 0.05 <= live_s < _SPIN_CPU_S + 1.0
  assert (after["self_tree_cpu_s"] - before["self_tree_cpu_s"]
          >= _SPIN_CPU_S - 0.05)
