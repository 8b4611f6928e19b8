"""python -m tfoverlap.burst_plan: plan burst-parallel layers offline, in
TensorFlow.

The mirror of `python -m torch_parity.burst_plan`, with the same flags and
the same flow (`overlap_core.planning.command.burst_plan_main`): reads the Keras
model's layer graph, times every layer forward and backward in TensorFlow
at the per-device batches the candidate widths give (or reads
--plan_profile, or DeepPool's files with --plan_profile_format=deeppool),
and gives every layer its own number of devices within
--amplification_limit. Nothing is trained.

  python -m tfoverlap.burst_plan --model=vgg16 --image_size=32 \\
      --batch_size=32 --strategy=mirrored --num_devices=4 \\
      --amplification_limit=2 --plan_bandwidth_gbps=10 \\
      --plan_output_dir=plan/

With --plan_output_dir it writes burst_plan.json, what --burst_parallel
reads (layers go by their neutral names, so either trainer runs it).
"""

import sys

from flags import entry_point
from overlap_core.planning import command
from tfoverlap import plan

PROGRAM = "tfoverlap.burst_plan"

# The same measuring as the pipeline planner's: the Keras graph, and every
# layer timed where the trainer runs it, at the batches the flow asks for.
main, run_main = entry_point.make_plan_main(command.burst_plan_main,
                                            plan.MEASURER)


if __name__ == "__main__":
  sys.exit(run_main())
