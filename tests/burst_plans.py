"""A burst plan with chosen widths, written as --burst_parallel reads it.

The trainers' tests pick the widths themselves (what the planner would pick
depends on a profile of this host); the predicted costs are placeholders.
"""

from overlap_core.planning.burst import BurstPlan, LayerPlan
from overlap_core.planning.burst_costs import split_samples


def write_plan(path, widths_by_layer: dict, *, model: str, global_batch: int,
               num_devices: int, iteration_s: float) -> BurstPlan:
  layers = tuple(
      LayerPlan(layer=name, op_type="layer", num_devices=k,
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
