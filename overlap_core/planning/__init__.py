"""How a model is split across devices: the shared planning layer.

Planners here are pure functions over plain data, and import no framework:
a layer graph and a per-layer profile come in, a plan with its reasons and
predicted costs comes out. Each framework side only measures (builds the
graph, profiles the layers) and executes (runs the plan), from the one
`parallelize` step of its trainer (tfoverlap/parallelize.py,
torch_parity/parallelize.py).

  dims        ParallelDims: the validated degrees of parallelism of one run,
              and where a rank sits on their mesh
  graph       LayerGraph: layers, edges, shapes, bytes, and the cut points
              where exactly one tensor crosses (JSON, summary, DOT)
  profile     Profile: measured forward/backward seconds per layer at
              several batch sizes (one JSON schema for every planner)
  cost_model  per layer type, a polynomial fit of time against the layer's
              configuration, with its error on held-out configurations
  partition   pipeline stages at cut points: auto (min-max), even, explicit;
              a StagePlan that explains itself; GPipe's bubble fraction
  report      the planning command's printout and files, shared by both
              frameworks
  command     the planning command's flow from a configuration: the
              micro-batch, batch sizes to profile, early refusal, report
  burst       burst parallelism (DeepPool): a width per layer under a
              per-layer amplification limit; burst_costs (compute,
              all-reduce, redistribution), burst_reduce (the exact minimum
              by series-parallel reduction), burst_report (the command's
              steps and files)
  profile_formats  reads DeepPool's job description and layer time
              table, and this project's per-layer time table
"""
