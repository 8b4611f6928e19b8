"""python -m benchmarks.gpu_campaign: every GPU measurement, in timed parts.

  python -m benchmarks.gpu_campaign --list              # parts and minutes
  python -m benchmarks.gpu_campaign --part=throughput   # one part
  python -m benchmarks.gpu_campaign --part=input,checkpoint
  python -m benchmarks.gpu_campaign                     # every part
  python -m benchmarks.gpu_campaign --dry_run           # a CPU host

Each part writes benchmarks/results/gpu/<part>.json with the GPU, driver,
torch and CUDA versions and the library's commit beside its results
(without .git, set TFOVERLAP_COMMIT to record it). On a host without CUDA
it exits 2 unless --dry_run: then every part's commands are built, the
first command of each runs with tiny sizes on the CPU, one thread a
process, with TensorFlow made unimportable (the GPU machine has none), and
the files go to a temporary directory unless --results_dir says where.
"""

import argparse
import os
import sys
import tempfile

from benchmarks import common
from benchmarks.gpu_campaign import environment, parts, runner

PROGRAM = "benchmarks.gpu_campaign"
RESULTS_DIR = os.path.join(common.RESULTS_DIR, "gpu")
# The H200 machine lends 10-minute commands: the parts each call runs.
CALLS = (("cuda_tests", "throughput", "multiplex"), ("input", "checkpoint"),
         ("offload_a", "offload_b"), ("offload_c",))


def parse_args(argv):
  parser = argparse.ArgumentParser(
      prog=PROGRAM, description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--part", default=None,
                      help="Comma-separated parts to run (default: all); "
                      "--list names them.")
  parser.add_argument("--list", action="store_true",
                      help="Print the parts and their expected minutes.")
  parser.add_argument("--dry_run", action="store_true",
                      help="On a CPU host: build every command, run each "
                      "part's first with tiny sizes.")
  parser.add_argument("--results_dir", default=None,
                      help="Where the parts' files go (default "
                      "benchmarks/results/gpu; a temporary directory with "
                      "--dry_run).")
  args = parser.parse_args(argv)
  names = args.part.split(",") if args.part else list(parts.PARTS_BY_NAME)
  unknown = [n for n in names if n not in parts.PARTS_BY_NAME]
  if unknown or not names:
    parser.exit(2, f"{PROGRAM}: --part={args.part}: unknown "
                f"{', '.join(unknown) or 'none given'}; allowed: "
                f"{', '.join(parts.PARTS_BY_NAME)}\n")
  args.parts = [parts.PARTS_BY_NAME[n] for n in names]
  return args


def format_list() -> str:
  from overlap_core.runtime import zoo  # pylint: disable=g-import-not-at-top
  lines = []
  for part in parts.PARTS:
    missing = [m for m in part.models if m not in zoo.MODEL_NAMES]
    models = ", ".join(part.models) or "-"
    if missing:
      models += f" (NOT IN THE ZOO: {', '.join(missing)})"
    lines.append(f"{part.name:<11} {part.minutes:4.1f} min  {part.goal}; "
                 f"models: {models}")
  total = sum(p.minutes for p in parts.PARTS)
  lines.append(f"total {total:.1f} min (estimates until measured; a part "
               f"must end within {parts.PART_LIMIT_MIN:g})")
  for index, call in enumerate(CALLS, 1):
    minutes = sum(parts.PARTS_BY_NAME[n].minutes for n in call)
    lines.append(f"call {index}: --part={','.join(call)}  ({minutes:.1f} min)")
  return "\n".join(lines)


def block_tensorflow(directory: str) -> str:
  """A directory whose `tensorflow` package raises ImportError: first on
  PYTHONPATH, it makes a CPU host import as the GPU machine does."""
  package = os.path.join(directory, "tensorflow")
  os.makedirs(package, exist_ok=True)
  with open(os.path.join(package, "__init__.py"), "w",
            encoding="utf-8") as f:
    f.write('raise ImportError("No module named \'tensorflow\' (the GPU '
            'campaign\'s dry run runs as the GPU machine, without it)")\n')
  return directory


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.list:
    print(format_list())
    return 0
  env = common.subprocess_env()
  with tempfile.TemporaryDirectory(prefix="gpu-campaign-") as scratch:
    if args.dry_run:
      env["PYTHONPATH"] = os.pathsep.join(
          [block_tensorflow(os.path.join(scratch, "no_tf")), common.REPO_ROOT,
           env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
      # One thread a process: a dry run proves that the commands run, and
      # on a busy CPU host a second thread spin-waits for the first (a
      # ResNet-50 step at 32x32 took seconds with two threads on two busy
      # cores, a quarter of one with one thread).
      env["OMP_NUM_THREADS"] = "1"
    described = environment.describe_in_child()
    if not described["cuda_available"] and not args.dry_run:
      print(f"{PROGRAM}: this host has no CUDA device (torch "
            f"{described['torch']}); run it on a GPU host, or pass "
            "--dry_run", file=sys.stderr)
      return 2
    results_dir = args.results_dir or (
        tempfile.mkdtemp(prefix="gpu-campaign-dry-") if args.dry_run
        else RESULTS_DIR)
    failed = []
    for part in args.parts:
      payload = runner.run_part(part, results_dir=results_dir,
                                dry_run=args.dry_run, environment=described,
                                env=env)
      if not payload["ok"]:
        failed.append(part.name)
  print(f"{len(args.parts)} part(s) in {results_dir}"
        + (f"; not ok: {', '.join(failed)}" if failed else ""))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
