"""The graphs TensorFlow ran for a traced step: after Grappler's rewrites,
cut into one partition graph per device, each run by that device's
executor. A test that asks where ops ran, or in what order they must run,
asks these, not the trace.

  functions = executed_functions(lambda: step(batch), marker_op_names)
  for function in functions:
    for partition in function.partition_graphs: ...
"""

# tf.function exposes no public per-call RunMetadata in TF2; the eager
# context's holds the partition graphs.
from tensorflow.python.eager import context


def executed_functions(call, marker_op_names) -> list:
  """Runs `call()` with run metadata on; returns the `FunctionGraphs` of
  the functions it ran whose graph before optimization holds every op in
  `marker_op_names` (names of the traced step's ops).

  Run metadata holds a function's partitions for its first call only, so
  `call` must be the step's first. While it is on, whatever else the
  process runs is recorded too (eager ops as functions of one op, the
  functions other threads call: seen in the whole suite, another model's
  training steps); the markers pick the step's own function out.
  """
  context.enable_run_metadata()
  try:
    call()
    metadata = context.export_run_metadata()
  finally:
    context.disable_run_metadata()
  markers = set(marker_op_names)
  return [f for f in metadata.function_graphs
          if markers <= {n.name for n in f.pre_optimization_graph.node}]
