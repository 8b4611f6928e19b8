"""The 1F1B memory and PP x DP overlap benchmark's summary, without a run."""

from benchmarks import pipeline_memory_overlap as bench


def _run(cell, repeat, per_stage, sps=100.0):
  return {"cell": list(cell), "repeat": repeat,
          "result": {"samples_per_second": sps,
                     "pipeline": {"per_stage": per_stage}}}


def _payload(one_f_bytes):
  runs = []
  for repeat in range(5):
    runs.append(_run((bench.MEMORY, "gpipe"), repeat, [
        {"saved_activation_peak_bytes": b} for b in (800, 400)]))
    runs.append(_run((bench.MEMORY, "1f1b"), repeat, [
        {"saved_activation_peak_bytes": b} for b in one_f_bytes]))
    runs.append(_run((bench.OVERLAP_CELL, "true"), repeat,
                     [{"exposed_comm_ms": 1.0}, {"exposed_comm_ms": 2.0}],
                     sps=110.0))
    runs.append(_run((bench.OVERLAP_CELL, "false"), repeat,
                     [{"exposed_comm_ms": 9.0}, {"exposed_comm_ms": 9.5}]))
  return {"runs": runs}


def test_1f1b_within_s_over_m_of_gpipe_meets_and_beyond_it_misses():
  # S/M = 2/8: stage 0 may hold 200 of GPipe's 800 bytes, stage 1 100 of
  # its 400.
  summary = bench.summarize(_payload([200, 50]))
  assert [m["verdict"] for m in summary["memory"]] == ["met", "met"]
  assert summary["memory"][0]["ratio"] == 0.25
  summary = bench.summarize(_payload([400, 50]))
  assert [m["verdict"] for m in summary["memory"]] == ["missed", "met"]


def test_the_overlap_is_read_per_stage_and_paired_by_repeat():
  summary = bench.summarize(_payload([200, 50]))
  overlapped = summary["overlap"]["true"]["exposed_comm_ms"]
  after = summary["overlap"]["false"]["exposed_comm_ms"]
  assert [e["median"] for e in overlapped] == [1.0, 2.0]
  assert [e["median"] for e in after] == [9.0, 9.5]
  assert summary["overlapped_over_after_step"]["median"] == 1.1
  assert "1F1B / GPipe" in bench.format_summary({"summary": summary})


def test_the_cells_ask_for_what_each_question_needs():
  memory = bench.cell_flags((bench.MEMORY, "1f1b"), 12)
  assert "--pipeline_schedule=1f1b" in memory
  assert f"--pipeline_microbatches={bench.MEMORY_MICROBATCHES}" in memory
  assert f"--num_devices={bench.STAGES}" in memory
  overlap = bench.cell_flags((bench.OVERLAP_CELL, "false"), 12)
  # Two replicas of each stage.
  assert f"--num_devices={2 * bench.STAGES}" in overlap
  assert "--pipeline_overlap_all_reduce=false" in overlap
