"""How a model is split across devices: the shared planning layer.

Planners here are pure functions over plain data, and import no framework:
a layer graph and a per-layer profile come in, a plan with its reasons and
predicted costs comes out. Each framework side only measures (builds the
graph, profiles the layers) and executes (runs the plan), from the one
`parallelize` step of its trainer (tfoverlap/parallelize.py,
torch_parity/parallelize.py).

  dims  ParallelDims: the validated degrees of parallelism of one run, and
        where a rank sits on their mesh
"""
