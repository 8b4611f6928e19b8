"""On-demand timings of tfoverlap's TensorFlow main path; not tests.

Each benchmark is `python -m benchmarks.<name>` from the repository root,
writes `benchmarks/results/<name>.json` and prints a table. See BENCHMARKS.md
for what each one measures and the results of the last full run.
"""
