"""python -m torch_parity.burst_plan: a plan, its files, the adapters,
refusals."""

import json

from overlap_core.planning import burst, deeppool_format, profile_formats
from overlap_core.planning.burst_costs import CommModel
from overlap_core.planning.burst import BurstPlan
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile

from tests import deeppool_files
from tests.helpers import run_module

ARGS = ("--model=small_cnn", "--batch_size=8", "--strategy=mirrored",
        "--num_devices=2", "--plan_warmup=0", "--plan_repeats=1",
        "--amplification_limit=2", "--plan_bandwidth_gbps=1",
        "--intra_op_threads=1")


def _one_error_line(result, needle):
  assert result.returncode == 2, result.stderr
  errors = [l for l in result.stderr.splitlines() if ": error: " in l]
  assert len(errors) == 1 and needle in errors[0], result.stderr
  assert "Traceback" not in result.stderr


def test_plan_files_adapter_and_refusals(tmp_path):
  out = tmp_path / "plan"
  result = run_module("torch_parity.burst_plan", *ARGS,
                      f"--plan_output_dir={out}", timeout=600)
  assert result.returncode == 0, result.stderr
  assert "enforced per layer" in result.stdout
  plan = BurstPlan.from_json((out / "burst_plan.json").read_text())
  graph = LayerGraph.from_json((out / "graph.json").read_text())
  # Layers go by their neutral names, what both trainers read.
  assert [lp.layer for lp in plan.layers] == list(
      graph.neutral_names().values())
  assert (plan.num_devices, plan.global_batch) == (2, 8)
  assert all(lp.amplification <= 2 + 1e-9 for lp in plan.layers)
  # The plot is drawn by the command the planner prints.
  plot = next(l for l in result.stdout.splitlines()
              if l.startswith("scaling plot: python -m "))
  module, *plot_args = plot.split("python -m ", 1)[1].split()
  drawn = run_module(module, *plot_args, timeout=300)
  assert drawn.returncode == 0, drawn.stderr
  assert (out / "burst_scaling.png").read_bytes()[:4] == b"\x89PNG"

  # The same numbers through the adapter's format give the same plan.
  profile = Profile.from_json((out / "profile.json").read_text())
  other = tmp_path / "other.json"
  other.write_text(profile_formats.write_per_layer_times(profile))
  again = run_module("torch_parity.burst_plan", *ARGS,
                     f"--plan_profile={other}",
                     "--plan_profile_format=per_layer_times",
                     f"--plan_output_dir={tmp_path / 'again'}", timeout=600)
  assert again.returncode == 0, again.stderr
  replan = BurstPlan.from_json(
      (tmp_path / "again" / "burst_plan.json").read_text())
  assert replan.widths_by_layer() == plan.widths_by_layer()

  # A profile without one layer cannot be planned: exit 2, one line.
  dropped = graph.nodes[1].name
  partial = json.loads(profile.to_json())
  partial["timings"] = [t for t in partial["timings"]
                        if t["layer"] != dropped]
  holed = tmp_path / "holed.json"
  holed.write_text(json.dumps(partial))
  _one_error_line(run_module("torch_parity.burst_plan", *ARGS,
                             f"--plan_profile={holed}", timeout=600),
                  f"layer {dropped!r} has no profile")


def test_a_plan_on_deeppool_files_builds_and_times_no_model(tmp_path):
  job, prof = deeppool_files.write_files(tmp_path)
  args = ("--plan_profile_format=deeppool", f"--plan_deeppool_job={job}",
          f"--plan_profile={prof}", "--batch_size=8", "--strategy=mirrored",
          "--num_devices=4", "--amplification_limit=2",
          "--plan_bandwidth_gbps=1")
  out = tmp_path / "plan"
  result = run_module("torch_parity.burst_plan", *args,
                      f"--plan_output_dir={out}", timeout=600)
  assert result.returncode == 0, result.stderr
  plan = BurstPlan.from_json((out / "burst_plan.json").read_text())
  # The job's layers, not --model's, and the plan made in-process on them.
  graph, profile = deeppool_format.read_deeppool(
      job.read_text(), prof.read_text(), model="job")
  assert LayerGraph.from_json((out / "graph.json").read_text()) == graph
  expected = burst.plan_burst(
      graph, profile, global_batch=8, num_devices=4, amplification_limit=2.0,
      comm=CommModel(bandwidth_bytes_per_s=1e9))
  assert plan.model == "job"
  assert plan.widths_by_layer() == expected.widths_by_layer()
  assert len(set(plan.widths_by_layer().values())) > 1

  # The job without its format, and the format without its table: exit 2.
  _one_error_line(run_module("torch_parity.burst_plan", *args[1:],
                             timeout=600),
                  "applies only with --plan_profile_format=deeppool")
  _one_error_line(run_module("torch_parity.burst_plan", *args[:2],
                             *args[3:], timeout=600),
                  "needs both")
  broken = tmp_path / "broken.prof"
  broken.write_text("conv2d 1 2 3\n")
  _one_error_line(run_module("torch_parity.burst_plan", *args[:2],
                             f"--plan_profile={broken}", *args[3:],
                             timeout=600),
                  "Invalid DeepPool layer profile: line 1")
