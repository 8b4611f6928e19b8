"""Burst plans for the trainers' tests: the planning command's own, or one
with chosen widths.

`plan_with_command` runs python -m torch_parity.burst_plan, what a user
runs. `write_plan` stays for the tests that need a plan the command cannot
promise: widths 1 and 2 both, to tell a burst run from a data-parallel or
single-device one (what the planner picks depends on this host's timings),
or a plan edited to be wrong. Its predicted costs are placeholders.
"""

import pathlib

from overlap_core.planning import burst_report
from overlap_core.planning.burst import BurstPlan, LayerPlan
from overlap_core.planning.burst_costs import split_samples

from tests.helpers import run_module

PLAN_TIMEOUT_S = 300


def plan_with_command(output_dir: pathlib.Path, *, model: str,
                      image_size: int, batch_size: int,
                      num_devices: int = 2) -> pathlib.Path:
  """The burst_plan.json the planning command writes for this run, timed
  at one repeat (the widths need not be good, only the command's own)."""
  result = run_module(
      "torch_parity.burst_plan", f"--model={model}",
      f"--image_size={image_size}", f"--batch_size={batch_size}",
      "--strategy=mirrored", f"--num_devices={num_devices}",
      "--amplification_limit=2", "--plan_bandwidth_gbps=10",
      "--plan_warmup=0", "--plan_repeats=1", "--intra_op_threads=1",
      f"--plan_output_dir={output_dir}", timeout=PLAN_TIMEOUT_S)
  assert result.returncode == 0, result.stderr[-3000:]
  return output_dir / burst_report.PLAN_NAME


def write_plan(path, widths_by_layer: dict, *, model: str, global_batch: int,
               num_devices: int, iteration_s: float,
               op_types: dict = None) -> BurstPlan:
  """A plan of these widths by neutral layer name; `op_types` gives a
  layer's kind where a runtime reads it (default "layer")."""
  op_types = op_types or {}
  layers = tuple(
      LayerPlan(layer=name, op_type=op_types.get(name, "layer"),
                num_devices=k,
                samples_per_device=split_samples(global_batch, k),
                compute_s=0.0, allreduce_s=0.0, transfer_in_s=0.0,
                gpu_s=0.0, amplification=1.0, widest_allowed=num_devices)
      for name, k in widths_by_layer.items())
  plan = BurstPlan(
      model=model, global_batch=global_batch, num_devices=num_devices,
      amplification_limit=2.0, enforced="per_layer",
      bandwidth_bytes_per_s=None, latency_s=0.0,
      widths=tuple(sorted(set(widths_by_layer.values()))), layers=layers,
      iteration_s=iteration_s, gpu_s=0.0, single_device_s=0.0,
      data_parallel_iteration_s=0.0, data_parallel_gpu_s=0.0)
  path.write_text(plan.to_json())
  return plan


def assert_split_placements(placements: dict, *, split, whole) -> None:
  """Layers of width 2 ran on CPU:0 and CPU:1, those of width 1 on CPU:0.

  Checked forward and backward: a single-device or a data-parallel step
  would place a layer of the other kind, and a backward left to the tape's
  own placement runs every part on CPU:0.
  """
  for layer in split:
    assert placements[layer] == {"forward": [["CPU:0"], ["CPU:1"]],
                                 "backward": [["CPU:0"], ["CPU:1"]]}, (
                                     placements)
  for layer in whole:
    assert placements[layer] == {"forward": [["CPU:0"]],
                                 "backward": [["CPU:0"]]}, placements
