"""Pipeline-parallel flags: stages, micro-batches, schedule, split."""

from absl import flags

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
RUNTIMES = ("devices", "processes")


def define_flags():
  flags.DEFINE_integer(
      "pipeline_stages", 1,
      "Pipeline stages the model is split into (1: not pipelined). The "
      "world is pipeline stages x data-parallel replicas.", lower_bound=1)
  flags.DEFINE_integer(
      "pipeline_microbatches", 1,
      "Micro-batches each pipeline's batch is split into; must divide it. "
      "A pipeline's batch is the global batch over the data-parallel "
      "replicas (world / stages): the whole batch when the stages fill the "
      "world. GPipe's idle bubble is (S-1)/(M+S-1).", lower_bound=1)
  flags.DEFINE_enum(
      "pipeline_schedule", "gpipe", list(SCHEDULES),
      "gpipe: all forwards, then all backwards. 1f1b: one forward, one "
      "backward (needs micro-batches >= stages). interleaved_1f1b: 1F1B "
      "over --pipeline_virtual_stages stages per rank. zero_bubble: "
      "backward split into input and weight gradients.")
  flags.DEFINE_string(
      "pipeline_split", "auto",
      "Where stages end. auto: the split whose slowest stage is fastest "
      "under the fitted per-layer cost model. even: about equal layer "
      "counts at the nearest cut points. Or the comma-separated layer "
      "names the first S-1 stages end with (python -m tfoverlap.plan and "
      "python -m torch_parity.plan print each framework's cut points).")
  flags.DEFINE_integer(
      "pipeline_virtual_stages", 1,
      "Stages per rank for interleaved_1f1b and zero_bubble (2 or more).",
      lower_bound=1)
  flags.DEFINE_boolean(
      "pipeline_overlap_all_reduce", True,
      "With stage replicas (a PyTorch world of stages x 2 or more "
      "replicas), all-reduce each stage's gradients bucket by bucket as the "
      "last micro-batch's backward finishes them. false: all-reduce after "
      "the schedule's step, all of it exposed (to measure what the overlap "
      "hides).")
  flags.DEFINE_boolean(
      "pipeline_stages_apart", False,
      "Each stage computes its micro-batches' forwards, then their "
      "backwards, on stand-ins held resident (the activations it would "
      "receive and the gradients sent back to it, made once: from the "
      "first batch in PyTorch, from the example batch in TensorFlow), "
      "never waiting for or sending to a neighbour: the same stages' work "
      "without the pipeline's bubble and transfers. An intervention for "
      "benchmarks (benchmarks/ledger_fidelity.py); the model does not "
      "learn what the pipeline would. TensorFlow: "
      "--pipeline_runtime=processes only.")
  flags.DEFINE_enum(
      "pipeline_runtime", "devices", list(RUNTIMES),
      "Where TensorFlow's stages run. devices: one process, stage k on "
      "its device k (GPUs, or logical CPU devices, which share one thread "
      "pool). processes: stage k in TensorFlow server process k, with its "
      "own threads, driven by one client process (python -m "
      "tfoverlap.launch starts them; TF_CONFIG or srun on several hosts); "
      "each stage's bubble is then measured, not derived. PyTorch's stages "
      "are always processes.")
  flags.DEFINE_string(
      "plan_profile", "",
      "A layer profile JSON (the shared schema; python -m tfoverlap.plan "
      "or python -m torch_parity.plan with --plan_output_dir writes "
      "profile.json, measured in that framework). The planning command "
      "reads it instead of measuring; a pipelined trainer fits the cost "
      "model on it to split with --pipeline_split=auto and records each "
      "stage's predicted time beside the measured one (each trainer warns "
      "about the other framework's profile, and refuses one timed under "
      "other threads, device, dtype or batches than its stages get).")
