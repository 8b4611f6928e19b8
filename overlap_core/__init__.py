"""overlap_core: what both framework sides share, written once.

It imports no framework (neither TensorFlow nor PyTorch) and no plotting
library, so both trainers, the flag surface and the comparison can depend on
it. Grouped by job:

  runtime     what a trainer runs: config, step ledger, run record, trace,
              progress and summary, loop context, process supervision
  checkpoint  the asynchronous checkpoint engine: cadence, background persist,
              files on disk, the safetensors format
  planning    how a model is split over devices (pipeline stages,
              burst-parallel layers): pure planners over plain data

Dependencies run one way: flags -> overlap_core; tfoverlap and torch_parity ->
flags and overlap_core; overlap_compare -> overlap_core and the trainers'
command lines. tools/update_build.py refuses an import that runs back up.
"""

# The one place the toolkit's version is declared (setup.py reads it here).
__version__ = "0.1.0"
