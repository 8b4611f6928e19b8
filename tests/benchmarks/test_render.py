"""The benchmark pages agree with benchmarks/results/*.json, through the renderer."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import harness
from benchmarks import offload_study
from benchmarks import render
from benchmarks import render_tables
from benchmarks import render_tables_parallel

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _document() -> str:
  return render.read_documents()


def _results(name: str) -> dict:
  with open(os.path.join(render_tables.RESULTS_DIR, name + ".json"),
            encoding="utf-8") as f:
    return json.load(f)


def test_the_document_agrees_with_the_results_files():
  stale = render.stale_blocks(_document())
  assert stale == [], (f"docs/benchmarks blocks {stale} disagree with "
                       "benchmarks/results; run python -m benchmarks.render")


def test_every_table_has_a_block_and_every_block_a_table():
  names = render.block_names(_document())
  assert sorted(names) == sorted(render_tables.TABLES)
  assert len(names) == len(set(names))


def test_a_number_edited_by_hand_is_caught():
  text = _document()
  # A leading digit on the first tfoverlap_ctl samples/s figure.
  edited = text.replace("| tfoverlap_ctl | ", "| tfoverlap_ctl | 9", 1)
  assert edited != text
  assert render.stale_blocks(edited) == ["trainer_overhead"]


def test_a_results_file_changed_without_rendering_is_caught(tmp_path,
                                                           monkeypatch):
  results = tmp_path / "results"
  shutil.copytree(render_tables.RESULTS_DIR, results)
  path = results / "data_knobs.json"
  data = json.loads(path.read_text(encoding="utf-8"))
  data["pipeline"]["cache"][1]["later_epochs_ms_per_batch"] *= 2
  path.write_text(json.dumps(data), encoding="utf-8")
  monkeypatch.setattr(render_tables, "RESULTS_DIR", str(results))
  assert render.stale_blocks(_document()) == ["data_knobs_cache"]


@pytest.mark.parametrize("text,message", [
    ("<!-- render: trainer_overhead -->\nno end\n", "complete blocks"),
    ("<!-- render: no_such_table -->\n<!-- /render -->", "unknown render"),
])
def test_malformed_blocks_are_refused_by_name(text, message):
  with pytest.raises(render.RenderError, match=message):
    render.render_text(text)


def test_a_bad_document_is_one_line_and_exit_2(tmp_path):
  document = tmp_path / "doc.md"
  document.write_text("<!-- render: nope -->\n<!-- /render -->\n",
                      encoding="utf-8")
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.render", f"--document={document}"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 2
  assert done.stderr.count("\n") == 1 and "unknown render block" in done.stderr


def test_stored_verdicts_are_the_harness_verdicts():
  # The JSON and the page must not judge one result two ways: every verdict
  # a results file stores is what harness.verdict says of its repeats.
  checked = 0
  for config in _results("trainer_overhead")["summary"].values():
    for side in config["sides"].values():
      if "per_repeat_time_ratios" in side:
        expected = harness.verdict(
            harness.median_interval(side["per_repeat_time_ratios"]),
            1.0 + side["target_max_overhead_frac"])
        assert side["target_verdict"] == expected
        checked += 1
  for name in ("torch_trainer_overhead", "torch_trainer_overhead_r5"):
    for config in _results(name)["summary"].values():
      expected = harness.verdict(
          harness.median_interval(config["time_ratio"]["p50"]["per_repeat"]),
          1.0 + config["target"]["max_overhead_frac"])
      assert config["target"]["verdict"] == expected
      checked += 1
  for cell in _results("data_wait")["summary"]:
    if "target_max_data_wait_fraction" in cell:
      expected = harness.verdict(
          harness.median_interval(cell["data_wait_fraction_all"]),
          cell["target_max_data_wait_fraction"])
      assert cell["target_verdict"] == expected
      assert "target_met" not in cell
      checked += 1
  assert checked == 4 + 4 + 6


def test_other_processes_share_is_read_from_runs_and_from_the_harness():
  # Per trainer run (files from before the harness): 3 s of 10 s on 2 cores.
  per_run = {"runs": [{"result": {"foreign_cpu_s": 3.0,
                                  "process_wall_s": 10.0}}]}
  assert render_tables.max_foreign_cpu_frac(per_run, 2) == 0.15
  # Per repeat of each section the harness measured, and a section
  # recorded whole; the largest share wins.
  harnessed = {"runs": [], "harness": {"host": {
      "profiling": {"foreign_cpu_frac": 0.02},
      "runs": {"foreign_cpu_frac": 0.01,
               "host_by_repeat": [{"foreign_cpu_frac": 0.004},
                                  {"foreign_cpu_frac": 0.03}]}}}}
  assert render_tables.max_foreign_cpu_frac(harnessed, 2) == 0.03
  assert render_tables.max_foreign_cpu_frac({"runs": []}, 2) is None


def test_offload_rows_follow_the_study_with_every_copy_statistic():
  data = _results(render_tables_parallel.OFFLOAD_RUN)
  rows = render_tables_parallel.offload_rows(data)
  by_model = {}
  for row in rows:
    by_model.setdefault(row[0], []).append(row[1])
  # The file keeps its keys sorted by name; the table does not.
  study = list(offload_study.VARIANTS)
  assert all(variants == study for variants in by_model.values())
  assert list(by_model)[0] == "vgg16"  # VGG-19's stand-in, in its place
  vgg_both = next(r for r in rows if r[:2] == ["vgg16", "both"])
  stats = data["results"]["vgg16"]["both"]
  assert vgg_both[2] == f"{stats['total_s']:.3f}"
  # mean / max / min / median of one copy to the host, as the file has them.
  assert vgg_both[6] == " / ".join(
      f"{stats['to_host'][k]:.3f}" for k in ("mean", "max", "min", "median"))
  # Tensors moved per step, not the prefetch count over all steps.
  assert vgg_both[5].startswith("43 ")
  prefetch = next(r for r in rows if r[:2] == ["vgg16", "prefetch"])
  assert prefetch[-1] == "42"


def test_a_capped_batch_search_renders_as_not_found():
  rows = render_tables_parallel.offload_batch_rows(
      "offload_h200_resnet50_batch")
  assert len(rows) == 1
  assert rows[0][2].startswith("≥ 2048: limit not found")
  assert rows[0][4].startswith("≥ 2048: limit not found")
  quick = render_tables_parallel.offload_batch_rows(
      render_tables_parallel.OFFLOAD_RUN)
  assert "not searched" in quick[0][2]


def test_a_new_batch_search_renders_both_and_its_limits(tmp_path,
                                                        monkeypatch):
  found = {"largest_batch": 700, "first_oom": 720, "limit_found": True,
           "cap": 4096, "cap_reason": "max_batch"}
  capped = {"largest_batch": 3000, "first_oom": None, "limit_found": False,
            "cap": 3000, "cap_reason": "host_memory"}
  data = {"settings": {"image_size": 224, "max_batch": 4096},
          "largest_batch": {"vgg19": {"baseline": found, "both": capped,
                                      "host_memory_cap": 3000}}}
  (tmp_path / "offload_new.json").write_text(json.dumps(data),
                                             encoding="utf-8")
  monkeypatch.setattr(render_tables, "RESULTS_DIR", str(tmp_path))
  [row] = render_tables_parallel.offload_batch_rows("offload_new")
  assert row[1:4] == ["vgg19", "700 (first out of memory: 720)", "`both`"]
  assert row[4] == ("≥ 3000: limit not found (search capped at 3000 by "
                    "the host-memory cap)")
  assert row[5] == "3000"
