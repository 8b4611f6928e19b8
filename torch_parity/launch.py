"""python -m torch_parity.launch: N PyTorch ranks on this host.

  python -m torch_parity.launch --num_workers=2 -- --model=resnet18
  python -m torch_parity.launch --num_workers=2 -- --strategy=horovod

Everything after `--` goes to every rank (the trainer's own flags, checked
here, including what PyTorch refuses, before anything starts). Every rank
gets the same `--model_dir`, `--num_workers` and an equal share of the
host's cores.

DDP (`--strategy=multi_worker`, the default here): the launcher starts the
ranks itself, each with the environment torchrun gives its workers (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), so
`python -m torch.distributed.run --standalone --nproc_per_node=2 -m
torch_parity.train --strategy=multi_worker --num_workers=2 ...` runs the same
job. Supervising the ranks directly, as the TensorFlow launcher does, gives
the same dead-rank handling in both frameworks: if any rank fails or is
killed, the others are stopped (SIGTERM, then SIGKILL after a grace period)
and the launcher exits non-zero with one line naming the rank and how it
died.

Under DDP a rank alive but stuck ends the job too: every collective gives
up after 180 s (`TFOVERLAP_COLLECTIVE_TIMEOUT_S`), and the launcher names
the rank that gave up as "timed out after N s waiting for a peer". Under
Horovod only transfers already begun are bounded (its gloo timeout).

Nothing of a DDP job listens beyond loopback: MASTER_ADDR is 127.0.0.1,
where rank 0 binds the rendezvous store and gloo its sockets
(`torch_parity.rendezvous`).

Horovod (`--strategy=horovod`): `horovodrun -np N -H localhost:N --gloo`
starts the ranks; it stops the others when one dies, and the launcher names
that rank the same way. horovodrun's rendezvous server listens on all
interfaces (Horovod binds it to every address, with no option); the
launcher says so in one line. It does not depend on a writable HOME.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
import time

from absl import app

import flags as tfo_flags
from overlap_core.runtime import failure
from overlap_core.runtime import network
from overlap_core.runtime import processes
from overlap_core.runtime import waits

tfo_flags.define_flags()

FRAMEWORK = "pytorch"
PROGRAM = "torch_parity.launch"
TRAINER_MODULE = "torch_parity.train"
# horovodrun prints a line like this for each rank that exits, in the order
# it notices them: the first non-zero one is what ended the job.
_HOROVOD_EXIT = re.compile(r"^Process (\d+) exit with status code (\d+)")
_SIGNAL_EXIT_BASE = 128  # a shell reports a process killed by N as 128 + N


def build_worker_args(trainer_args: list, num_workers: int) -> list:
  """The trainer flags every rank runs with.

  `--strategy=horovod` is kept; anything else becomes multi_worker (DDP
  over the launched world), as the TensorFlow launcher does.
  """
  args = [a for a in trainer_args
          if not processes.has_flag([a], "num_workers")]
  if processes.flag_value(args, "strategy") != "horovod":
    args.append("--strategy=multi_worker")
  args.append(f"--num_workers={num_workers}")
  return processes.add_job_defaults(args, framework=FRAMEWORK,
                                    num_processes=num_workers)


def torchrun_env(base_env: dict, *, rank: int, world_size: int,
                 master_port: int) -> dict:
  """The environment torchrun gives rank `rank` of a one-host world."""
  env = dict(base_env)
  env.update({
      "RANK": str(rank),
      "LOCAL_RANK": str(rank),
      "WORLD_SIZE": str(world_size),
      "LOCAL_WORLD_SIZE": str(world_size),
      "GROUP_RANK": "0",
      "GROUP_WORLD_SIZE": "1",
      "ROLE_NAME": "default",
      "ROLE_RANK": str(rank),
      "ROLE_WORLD_SIZE": str(world_size),
      "MASTER_ADDR": "127.0.0.1",
      "MASTER_PORT": str(master_port),
      # torchrun's own default is 1 thread per rank; an equal share of the
      # cores uses the host without oversubscribing it.
      "OMP_NUM_THREADS": str(processes.cpu_share(world_size)),
  })
  return env


def launch_ranks(num_ranks: int, worker_args: list, *,
                 program: str = PROGRAM, one_worker: bool = False) -> int:
  """Starts `num_ranks` DDP ranks of the trainer and supervises them.

  `one_worker`: the ranks are the replicas of one worker (mirrored), and
  only rank 0 writes a run.json.
  """
  master_port = processes.free_ports(1)[0]
  specs = [
      processes.ProcessSpec(
          argv=[sys.executable, "-m", TRAINER_MODULE] + worker_args,
          env=torchrun_env(os.environ, rank=rank, world_size=num_ranks,
                           master_port=master_port),
          record_path=(None if one_worker and rank else
                       processes.record_path(worker_args, rank)))
      for rank in range(num_ranks)
  ]
  return processes.run_supervised(specs, program=program, noun="rank")


def launch_replicas(num_devices: int, trainer_args: list, *,
                    program: str) -> int:
  """The processes of `--strategy=mirrored`: one DDP rank per device.

  Called by the trainer itself; every replica gets the same model_dir and
  an equal share of the cores, and runs with the same flags.
  """
  args = processes.add_job_defaults(trainer_args, framework=FRAMEWORK,
                                    num_processes=num_devices)
  return launch_ranks(num_devices, args, program=program, one_worker=True)


def horovodrun_command(num_workers: int, worker_args: list) -> list:
  """horovodrun on localhost with Gloo, running the trainer on each rank."""
  # The horovodrun of this Python environment, even when it is not on PATH.
  horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
  if not os.path.exists(horovodrun):
    horovodrun = shutil.which("horovodrun") or "horovodrun"
  # --disable-cache: horovodrun would otherwise keep the results of its
  # start-up checks under $HOME/.horovod, failing where HOME is read-only
  # (a sandbox, a shared cluster home). The cache only saves the ssh checks
  # of remote hosts, and every rank here is on localhost.
  return [horovodrun, "-np", str(num_workers), "-H",
          f"localhost:{num_workers}", "--gloo", "--disable-cache",
          sys.executable, "-m", TRAINER_MODULE] + worker_args


def describe_horovod_exit(code: int) -> str:
  if _SIGNAL_EXIT_BASE < code < _SIGNAL_EXIT_BASE + 65:
    return processes.describe_exit(_SIGNAL_EXIT_BASE - code)
  return processes.describe_exit(code)


def _forward(source, sink, failures: list) -> None:
  """Copies horovodrun's output line by line, noting failed ranks."""
  for line in source:
    sink.write(line)
    sink.flush()
    match = _HOROVOD_EXIT.match(line)
    if match and match.group(2) != "0":
      failures.append((int(match.group(1)), int(match.group(2))))


def horovod_exposure_warning() -> str:
  """The one line that says what horovodrun exposes to the network."""
  return network.exposure_warning(
      PROGRAM, "horovodrun's rendezvous server (HTTP)", "a port it picks",
      "Horovod binds it to every address and offers no option; run on a "
      "host whose firewall closes it to others")


def launch_horovod(num_workers: int, worker_args: list) -> int:
  """Runs the ranks under horovodrun; names the first rank that died."""
  from torch_parity import distribute  # pylint: disable=g-import-not-at-top
  config = tfo_flags.to_config(tfo_flags.FLAGS)
  env = dict(os.environ, **distribute.horovod_env(config.distribute))
  env["OMP_NUM_THREADS"] = str(processes.cpu_share(num_workers))
  started_s = time.time()
  network.print_warning(horovod_exposure_warning())
  process = subprocess.Popen(
      horovodrun_command(num_workers, worker_args), env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      preexec_fn=processes.die_with_parent)
  failures = []
  forwarders = [
      threading.Thread(target=_forward, args=(process.stdout, sys.stdout,
                                               failures), daemon=True),
      threading.Thread(target=_forward, args=(process.stderr, sys.stderr,
                                               failures), daemon=True),
  ]
  for thread in forwarders:
    thread.start()
  try:
    code = process.wait()
  finally:
    processes.stop_processes([process])
  for thread in forwarders:
    thread.join(timeout=5)
  if code == 0:
    return 0
  if failures:
    # The ranks horovodrun stopped afterwards (SIGTERM) come later.
    rank, status = failures[0]
    cause = failure.recorded_cause(processes.record_path(worker_args, rank),
                                   since_s=started_s)
    how = describe_horovod_exit(status) + (f" ({cause})" if cause else "")
    print(f"{PROGRAM}: rank {rank} {how}; "
          "horovodrun stopped the other rank(s)", file=sys.stderr, flush=True)
  else:
    print(f"{PROGRAM}: horovodrun {processes.describe_exit(code)}",
          file=sys.stderr, flush=True)
  return code if code > 0 else 1


def _check_supported(config) -> None:
  from torch_parity import trainer  # pylint: disable=g-import-not-at-top
  trainer.check_supported(config)
  waits.collective_timeout_s()  # the ranks read it from the environment


def parse_launcher_flags(argv):
  """Launcher flags before `--`; the trainer's after it, validated now."""
  return tfo_flags.parse_launcher_argv(argv,
                                       build_worker_args=build_worker_args,
                                       check=_check_supported)


def main(argv):
  num_workers = tfo_flags.FLAGS.num_workers
  if tfo_flags.FLAGS.strategy == "horovod":
    sys.exit(launch_horovod(num_workers, argv[1:]))
  sys.exit(launch_ranks(num_workers, argv[1:]))


def run_main():
  app.run(main, flags_parser=parse_launcher_flags)


if __name__ == "__main__":
  run_main()
