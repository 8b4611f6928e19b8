"""overlap_compare: overlap combinations x frameworks, measured side by side.

`python -m overlap_compare` (also the `tfoverlap-compare` command) runs a
matrix of trainer flag settings in each framework, each run its own trainer
subprocess, and writes a report of where combining overlaps stops paying.
It imports neither TensorFlow nor PyTorch: the trainers are reached only
through their command lines.

  cli              the command: flags, plan, run, report
  matrix           the matrix spec grammar and its cells
  plan             flags per cell, run order, run directories
  trainer_runs     one trainer run as a subprocess
  comparison       runs gathered per cell and group
  metrics          per-cell medians, speed-ups, overlap efficiency,
                   each pipelined run's stages
  findings         the findings in words
  report           report.md, results.csv, runs.csv
  plots            the PNG plots (needs the `compare` extra: matplotlib)
  autotune         successive halving under constraints
  autotune_runs    the search, run as trainer subprocesses
  autotune_report  autotune.md and autotune.csv
"""
