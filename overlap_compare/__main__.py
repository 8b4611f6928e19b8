"""python -m overlap_compare: see overlap_compare/cli.py."""

from overlap_compare import cli

if __name__ == "__main__":
  cli.run_main()
