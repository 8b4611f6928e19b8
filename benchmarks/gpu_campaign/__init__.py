"""The GPU campaign: every GPU measurement of this project, in timed parts.

`python -m benchmarks.gpu_campaign --list` names the parts; see __main__.
"""
