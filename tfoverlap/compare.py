"""python -m tfoverlap.compare: the comparison, under the name users know.

The comparison drives both frameworks, so it lives in its own package,
`overlap_compare` (`python -m overlap_compare`); this alias keeps the
command that the README and existing scripts use.
"""

from overlap_compare import cli

if __name__ == "__main__":
  cli.run_main()
