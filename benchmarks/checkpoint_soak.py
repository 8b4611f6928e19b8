"""Kills real training runs at random moments; checks no checkpoint is lost.

  python -m benchmarks.checkpoint_soak                 # full: 100 kills each
  python -m benchmarks.checkpoint_soak --kills=5       # smoke run
  python -m benchmarks.checkpoint_soak --frameworks=pytorch --seed=3

Each framework's trainer (`python -m tfoverlap.train`, `python -m
torch_parity.train`) runs a small deterministic workload with
`--checkpoint=async`, a checkpoint every few steps, and `--checkpoint_keep`
1 or 3 (alternating from campaign to campaign). A campaign is one model
directory, restarted after every kill until its run completes. Each life is
SIGKILLed (its whole process group) when a randomly drawn point of its own
progress is reached, never after a wall-clock delay:

  steps    after its N-th progress line (one per step);
  persist  when the M-th checkpoint write (`.tmp-ckpt-*`) has appeared,
           once it holds J files (or, if it is committed first, at once).

Between lives, now and then, the newest checkpoint is corrupted (bytes
flipped); with keep=1 the campaign's previous good checkpoint is first put
back beside it, so that the next life falls back past the corrupt one and
its first save must not take the good one with it. A completed run is now
and then run again (rerun-after-finish): its final checkpoint must stay
byte for byte.

After every life, a copy of the checkpoint directory is recovered as a
restart would and checked: the newest checkpoint loads and verifies, no
checkpoint verified before the life fails now unless deliberately damaged,
and at least min(keep, good ones before the life) verify. Each completed
run's `weights_digest` must equal an uninterrupted run's.

Results: benchmarks/results/checkpoint_soak.json (a run with fewer kills
than the default writes checkpoint_soak.quick.json). Exit status 1 when any
check failed.
"""

import argparse
import dataclasses
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

from benchmarks import common
from benchmarks import harness
from overlap_core.checkpoint import files as checkpoint_files
from overlap_core.runtime import run_record

NAME = "checkpoint_soak"
DEFAULT_KILLS = 100
FRAMEWORKS = ("tensorflow", "pytorch")
# The workloads whose resumes the tests prove bit-identical.
EXACT_FLAGS = {
    "tensorflow": ["--model=small_cnn", "--strategy=default",
                   "--deterministic", "--batch_size=32"],
    "pytorch": ["--model=mlp", "--strategy=default", "--deterministic",
                "--image_size=8", "--batch_size=32", "--intra_op_threads=1",
                "--inter_op_threads=1"],
}
OUTPUT_FLAGS = ["--tensorboard=false", "--trace=false", "--evaluate=false",
                "--log_every_steps=1"]
LIFE_TIMEOUT_S = 600  # a guard against a hung trainer, not a trigger
CORRUPT_PROBABILITY = 0.2
RERUN_PROBABILITY = 0.5
_POLL_S = 0.002  # how often a life's checkpoint directory is looked at


@dataclasses.dataclass
class Tally:
  kills: int = 0
  kills_by_trigger: Dict[str, int] = dataclasses.field(
      default_factory=lambda: {"steps": 0, "persist": 0})
  lives: int = 0
  campaigns: int = 0
  corruptions: int = 0
  fallbacks_planted: int = 0
  reruns_after_finish: int = 0
  failed_verifications: int = 0
  checkpoints_lost: int = 0
  final_checkpoint_rewritten: int = 0
  digest_matches: int = 0
  digest_mismatches: int = 0
  problems: List[str] = dataclasses.field(default_factory=list)

  def problem(self, message: str) -> None:
    common.log(f"PROBLEM: {message}")
    self.problems.append(message)


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--kills", type=int, default=DEFAULT_KILLS,
                      help=f"SIGKILLs per framework (default {DEFAULT_KILLS})")
  parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
  parser.add_argument("--train_steps", type=int, default=30)
  parser.add_argument("--checkpoint_every", type=int, default=3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--output", default=None)
  args = parser.parse_args()
  if args.kills < 1:
    parser.error(f"--kills={args.kills}: allowed: >= 1")
  args.frameworks = [f for f in args.frameworks.split(",") if f]
  for framework in args.frameworks:
    if framework not in FRAMEWORKS:
      parser.error(f"--frameworks: unknown {framework!r}; allowed: "
                   f"{', '.join(FRAMEWORKS)}")
  args.quick = args.kills < DEFAULT_KILLS
  return args


def trainer_command(framework: str, model_dir: str, args, *,
                    keep: Optional[int]) -> List[str]:
  checkpoint = ([] if keep is None else
                ["--checkpoint=async",
                 f"--checkpoint_every={args.checkpoint_every}",
                 f"--checkpoint_keep={keep}"])
  return [sys.executable, "-m", common.TRAINER_MODULES[framework],
          *EXACT_FLAGS[framework], *OUTPUT_FLAGS, *checkpoint,
          f"--train_steps={args.train_steps}", f"--model_dir={model_dir}"]


# --- one life ------------------------------------------------------------------


def draw_trigger(rng: random.Random, args) -> dict:
  if rng.random() < 0.5:
    # Past the next checkpoint or two: a life that is killed before any
    # checkpoint is as good as lost, a longer one completes the run.
    return {"kind": "steps",
            "after_lines": rng.randint(1, 2 * args.checkpoint_every + 1)}
  return {"kind": "persist", "nth_write": rng.randint(1, 3),
          "files": rng.randint(0, 3)}


def _pending_writes(directory: str) -> List[str]:
  try:
    return [n for n in os.listdir(directory) if n.startswith(".tmp-ckpt-0")]
  except OSError:
    return []


def _count_files(path: str) -> int:
  try:
    return len(os.listdir(path))
  except OSError:
    return -1  # committed (renamed) or removed


class _Watch:
  """Follows a life's progress: stdout lines and checkpoint writes begun."""

  def __init__(self, process, directory: str):
    self.lines = 0
    self._queue = queue.Queue()
    self._directory = directory
    self.writes_seen: List[str] = []
    # Left by the previous life; this one's recovery deletes or promotes them.
    self._stale = set(_pending_writes(directory))
    threading.Thread(target=self._read, args=(process.stdout,),
                     daemon=True).start()

  def _read(self, stream) -> None:
    for line in stream:
      self._queue.put(line)

  def poll(self) -> None:
    try:
      while True:
        if "step " in self._queue.get(timeout=_POLL_S):
          self.lines += 1
    except queue.Empty:
      pass
    for name in _pending_writes(self._directory):
      if name not in self.writes_seen and name not in self._stale:
        self.writes_seen.append(name)

  def reached(self, trigger: dict) -> bool:
    if trigger["kind"] == "steps":
      return self.lines >= trigger["after_lines"]
    if len(self.writes_seen) < trigger["nth_write"]:
      return False
    write = os.path.join(self._directory,
                         self.writes_seen[trigger["nth_write"] - 1])
    files = _count_files(write)
    return files < 0 or files >= trigger["files"]


def run_life(command: List[str], directory: str, stderr_path: str,
             trigger: Optional[dict]) -> dict:
  """Runs one trainer life; kills it when `trigger` is reached."""
  with open(stderr_path, "w", encoding="utf-8") as stderr:
    process = subprocess.Popen(
        command, cwd=common.REPO_ROOT, env=common.subprocess_env(),
        stdout=subprocess.PIPE, stderr=stderr, text=True,
        start_new_session=True)  # its data-loader workers die with it
    watch = _Watch(process, directory)
    deadline = time.monotonic() + LIFE_TIMEOUT_S
    killed = hung = False
    while process.poll() is None:
      watch.poll()
      if trigger is not None and watch.reached(trigger):
        killed = _kill_group(process)
        break
      if time.monotonic() > deadline:
        hung = _kill_group(process)
        break
    process.wait()
    process.stdout.close()
  with open(stderr_path, encoding="utf-8") as f:
    stderr_tail = f.read()[-2000:]
  return {"killed": killed and process.returncode == -signal.SIGKILL,
          "returncode": process.returncode, "hung": hung,
          "step_lines": watch.lines, "stderr_tail": stderr_tail}


def _kill_group(process) -> bool:
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except ProcessLookupError:
    return False  # it had ended already
  return True


# --- checks --------------------------------------------------------------------


def good_checkpoints(directory: str, scratch: str) -> Dict[int, str]:
  """step -> path of every checkpoint that verifies, after a recovery.

  On a copy: the next life must find the directory as the kill left it.
  """
  copy = os.path.join(scratch, "verify")
  shutil.rmtree(copy, ignore_errors=True)
  if not os.path.isdir(directory):
    return {}
  shutil.copytree(directory, copy)
  checkpoint_files.recover(copy)
  good = {}
  for step in checkpoint_files.list_checkpoints(copy):
    name = checkpoint_files.checkpoint_dir_name(step)
    if checkpoint_files.verifies(os.path.join(copy, name)):
      good[step] = os.path.join(directory, name)
  return good


def check_after_life(directory: str, scratch: str, keep: int,
                     good_before: Dict[int, str], damaged: set,
                     tally: Tally) -> Dict[int, str]:
  """The retention promise, checked after a life; the good ones now."""
  good = good_checkpoints(directory, scratch)
  copy = os.path.join(scratch, "verify")
  listed = checkpoint_files.list_checkpoints(copy)
  bad = [s for s in listed if s not in good and s not in damaged]
  if bad:
    tally.failed_verifications += len(bad)
    tally.problem(f"{directory}: checkpoints {bad} do not verify")
  lost = max(0, min(keep, len(good_before)) - len(good))
  if lost:
    tally.checkpoints_lost += lost
    tally.problem(f"{directory}: {sorted(good)} good after a life that "
                  f"began with {sorted(good_before)} (keep={keep})")
  if good_before and (not good or max(good) < max(good_before)):
    tally.problem(f"{directory}: newest good went back from "
                  f"{max(good_before)} to {max(good) if good else None}")
  loaded = (checkpoint_files.load_latest(copy, warn=lambda m: None)
            if good else None)
  if good and loaded.step != max(good):
    tally.problem(f"{directory}: load_latest gave {loaded.step}, not "
                  f"{max(good)}")
  return good


def flip_bytes(checkpoint: str, rng: random.Random) -> None:
  path = os.path.join(checkpoint, "model.safetensors")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    offset = rng.randrange(size // 2, size - 8)
    f.seek(offset)
    data = f.read(8)
    f.seek(offset)
    f.write(bytes(b ^ 0xA5 for b in data))


def corrupt_newest(directory: str, good: Dict[int, str], keep: int,
                   spare: Optional[str], rng: random.Random,
                   tally: Tally) -> Optional[int]:
  """Damages the newest good checkpoint; returns its step (None: skipped).

  The run must keep a good checkpoint to fall back to. With keep=1 the
  campaign's previous good checkpoint (`spare`, a copy) is put back first,
  as a kill between a commit and its prune would have left it.
  """
  newest = max(good)
  if not os.path.isdir(good[newest]):
    return None  # complete only once the next life's recovery promotes it
  if len(good) < 2:
    if keep != 1 or spare is None:
      return None
    step = int(os.path.basename(spare).split("-")[1])
    target = os.path.join(directory, os.path.basename(spare))
    if step >= newest or os.path.exists(target):
      return None
    staging = os.path.join(directory, ".tmp-ckpt-planted")
    shutil.copytree(spare, staging)
    os.rename(staging, target)
    tally.fallbacks_planted += 1
  flip_bytes(good[newest], rng)
  tally.corruptions += 1
  return newest


# --- campaigns -----------------------------------------------------------------


def check_digest(model_dir: str, reference: str, tally: Tally) -> None:
  digest = run_record.load_run_record(model_dir)["weights_digest"]
  if digest == reference:
    tally.digest_matches += 1
  else:
    tally.digest_mismatches += 1
    tally.problem(f"{model_dir}: weights_digest {digest} != uninterrupted "
                  f"{reference}")


def rerun_after_finish(framework: str, model_dir: str, args, keep: int,
                       reference: str, scratch: str, tally: Tally) -> None:
  directory = os.path.join(model_dir, "checkpoints")
  newest = checkpoint_files.list_checkpoints(directory)[-1]
  manifest = os.path.join(directory,
                          checkpoint_files.checkpoint_dir_name(newest),
                          checkpoint_files.MANIFEST_NAME)
  with open(manifest, "rb") as f:
    before = f.read()
  life = run_life(trainer_command(framework, model_dir, args, keep=keep),
                  directory, os.path.join(scratch, "stderr.txt"), None)
  tally.reruns_after_finish += 1
  if life["returncode"] != 0:
    tally.problem(f"rerun after finish exited {life['returncode']}: "
                  f"{life['stderr_tail'][-500:]}")
    return
  with open(manifest, "rb") as f:
    if f.read() != before:
      tally.final_checkpoint_rewritten += 1
      tally.problem(f"{model_dir}: the rerun rewrote ckpt {newest}")
  check_digest(model_dir, reference, tally)


def keep_spare(good: Dict[int, str], scratch: str) -> Optional[str]:
  """Copies the newest good checkpoint aside; its copy's path, or None."""
  spare_dir = os.path.join(scratch, "spare")
  shutil.rmtree(spare_dir, ignore_errors=True)
  if not good or not os.path.isdir(good[max(good)]):
    return None
  spare = os.path.join(spare_dir, os.path.basename(good[max(good)]))
  shutil.copytree(good[max(good)], spare)
  return spare


def run_campaign(framework: str, args, keep: int, reference: str,
                 scratch: str, rng: random.Random, tally: Tally,
                 kills_left: int) -> None:
  """One model directory, killed and restarted until its run completes."""
  model_dir = tempfile.mkdtemp(prefix=f"campaign-keep{keep}-", dir=scratch)
  directory = os.path.join(model_dir, "checkpoints")
  command = trainer_command(framework, model_dir, args, keep=keep)
  tally.campaigns += 1
  good: Dict[int, str] = {}
  spare = None  # a copy of the newest good checkpoint before the last life
  damaged = set()
  while True:
    # Drawn, but at least once per framework, so a short run covers it;
    # before the last life too, whose digest then checks the fallback.
    if good and (rng.random() < CORRUPT_PROBABILITY
                 or tally.corruptions == 0):
      step = corrupt_newest(directory, good, keep, spare, rng, tally)
      if step is not None:
        damaged.add(step)
        good = good_checkpoints(directory, scratch)
    spare = keep_spare(good, scratch)
    trigger = draw_trigger(rng, args) if kills_left > 0 else None
    life = run_life(command, directory, os.path.join(scratch, "stderr.txt"),
                    trigger)
    tally.lives += 1
    if life["killed"]:
      tally.kills += 1
      kills_left -= 1
      tally.kills_by_trigger[trigger["kind"]] += 1
    elif life["returncode"] != 0:
      tally.problem(f"{framework} life exited {life['returncode']}"
                    f"{' (hung)' if life['hung'] else ''}: "
                    f"{life['stderr_tail'][-800:]}")
      return
    good = check_after_life(directory, scratch, keep, good, damaged, tally)
    if not life["killed"]:
      check_digest(model_dir, reference, tally)
      if rng.random() < RERUN_PROBABILITY or tally.reruns_after_finish == 0:
        rerun_after_finish(framework, model_dir, args, keep, reference,
                           scratch, tally)
      shutil.rmtree(model_dir, ignore_errors=True)
      return
    common.log(f"{framework}: kill {tally.kills}/{args.kills} "
               f"({trigger['kind']}, {life['step_lines']} step lines), good "
               f"checkpoints now {sorted(good)}")


def soak_framework(framework: str, args, rng: random.Random) -> dict:
  tally = Tally()
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix=f"soak-{framework}-") as scratch:
    reference_dir = os.path.join(scratch, "uninterrupted")
    life = run_life(trainer_command(framework, reference_dir, args,
                                    keep=None),
                    reference_dir, os.path.join(scratch, "stderr.txt"), None)
    if life["returncode"] != 0:
      raise common.BenchmarkError(f"uninterrupted {framework} run failed: "
                                  f"{life['stderr_tail']}")
    reference = run_record.load_run_record(reference_dir)["weights_digest"]
    keeps = (1, 3)
    # Several campaigns, so that both keeps get their share of the kills.
    per_campaign = max(2, args.kills // 10)
    while tally.kills < args.kills:
      keep = keeps[tally.campaigns % len(keeps)]
      common.log(f"{framework}: campaign {tally.campaigns + 1}, keep={keep}")
      run_campaign(framework, args, keep, reference, scratch, rng, tally,
                   kills_left=min(per_campaign, args.kills - tally.kills))
      if len(tally.problems) > 20:
        tally.problem("too many problems: stopping this framework")
        break
  result = dataclasses.asdict(tally)
  result.update(reference_digest=reference,
                digest_match=tally.digest_mismatches == 0
                and tally.digest_matches > 0,
                wall_s=time.perf_counter() - start)
  return result


def main():
  args = parse_args()
  rng = random.Random(args.seed)
  def run_one(framework, _):
    common.log(f"{framework}: {args.kills} kills")
    return {"framework": framework,
            "result": soak_framework(framework, args, rng)}

  # One repeat: the soak counts lost checkpoints, it compares no times. The
  # harness records the host's load beside the counts all the same, since a
  # loaded host moves where the kills land.
  record = harness.run_interleaved(list(args.frameworks), 1, run_one)
  results = {r["framework"]: r["result"] for r in record["runs"]}
  payload = {
      "benchmark": NAME,
      "date": time.strftime("%Y-%m-%d %H:%M:%S"),
      "machine": common.describe_machine(),
      "command": common.command_line(),
      "load_average_before": record["host"]["load_average_before"],
      "load_average_after": record["host"]["load_average_after"],
      "config": {"train_steps": args.train_steps,
                 "checkpoint_every": args.checkpoint_every,
                 "keep": [1, 3], "seed": args.seed, "kills": args.kills,
                 "trainer_flags": {f: EXACT_FLAGS[f] + OUTPUT_FLAGS
                                   for f in args.frameworks}},
      "frameworks": results,
  }
  payload.update(harness.payload_fields({"all": record["host"]}))
  path = common.result_path(NAME, args)
  common.write_results(path, payload)
  rows = [[f, r["kills"], r["kills_by_trigger"]["persist"], r["corruptions"],
           r["reruns_after_finish"], r["failed_verifications"],
           r["checkpoints_lost"], r["digest_match"], len(r["problems"])]
          for f, r in results.items()]
  print(common.format_table(
      ["framework", "kills", "in persist", "corrupted", "reruns",
       "failed verifications", "lost", "digest match", "problems"], rows))
  print(f"wrote {path}")
  return 0 if all(not r["problems"] for r in results.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
