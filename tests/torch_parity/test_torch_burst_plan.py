"""python -m torch_parity.burst_plan: a plan, its files, the adapter, refusals."""

import json

from overlap_core.planning import profile_formats
from overlap_core.planning.burst import BurstPlan
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile

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
  assert [lp.layer for lp in plan.layers] == [n.name for n in graph.nodes]
  assert (plan.num_devices, plan.global_batch) == (2, 8)
  assert all(lp.amplification <= 2 + 1e-9 for lp in plan.layers)
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
