"""What a campaign part ran on: GPU, driver, torch, CUDA, the commit.

Read in a child process (`python -m benchmarks.gpu_campaign.environment`),
so that the campaign's own process never opens a CUDA context: the parts
it starts get the whole device. Nothing here imports TensorFlow.
"""

import json
import subprocess
import sys

from benchmarks import common

_DRIVER_QUERY = ["nvidia-smi", "--query-gpu=driver_version",
                 "--format=csv,noheader"]


def driver_version() -> str:
  """The NVIDIA driver's version, from nvidia-smi; "unknown" without it."""
  try:
    done = subprocess.run(_DRIVER_QUERY, capture_output=True, text=True,
                          timeout=30, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return "unknown"
  lines = done.stdout.split()
  return lines[0] if done.returncode == 0 and lines else "unknown"


def describe_torch() -> dict:
  """torch's versions and, where CUDA is available, the first GPU."""
  import torch  # pylint: disable=g-import-not-at-top
  record = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}
  if record["cuda_available"]:
    properties = torch.cuda.get_device_properties(0)
    record.update(
        gpu_name=properties.name,
        gpu_count=torch.cuda.device_count(),
        gpu_memory_gib=round(properties.total_memory / 2**30, 1),
        compute_capability=f"{properties.major}.{properties.minor}",
        cudnn=torch.backends.cudnn.version())
  return record


def describe() -> dict:
  """The record every part's results file carries."""
  return {**common.describe_machine(), **describe_torch(),
          "driver": driver_version()}


def describe_in_child(timeout_s: float = 120) -> dict:
  """`describe()`, from a child process (see the module's docstring)."""
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.gpu_campaign.environment"],
      cwd=common.REPO_ROOT, env=common.subprocess_env(), capture_output=True,
      text=True, timeout=timeout_s, check=False)
  if done.returncode != 0:
    raise common.BenchmarkError(
        f"reading the environment failed: {done.stderr.strip()[-2000:]}")
  return json.loads(done.stdout)


if __name__ == "__main__":
  print(json.dumps(describe()))
