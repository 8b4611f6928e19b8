"""python -m tfoverlap.launch: N multi-worker trainers on this host.

  python -m tfoverlap.launch --num_workers=2 -- --model=resnet18 --train_steps=50

Everything after `--` goes to every worker (the trainer's own flags, checked
here before anything starts). Each worker gets TF_CONFIG for a localhost
cluster, `--strategy=multi_worker`, the same `--model_dir`, and an equal share
of the host's cores. If any worker fails or is killed, the others are stopped
(SIGTERM, then SIGKILL after a grace period) and the launcher exits non-zero
naming the worker: a dead peer never leaves the job hanging in a collective.
A worker alive but stuck ends the job too: every collective gives up after
180 s (`TFOVERLAP_COLLECTIVE_TIMEOUT_S`), and the launcher names the worker
that gave up as "timed out after N s waiting for a peer".

With `--pipeline_runtime=processes` among the trainer's flags it starts a
pipeline job instead: one stage server per --pipeline_stages and one client,
all `python -m tfoverlap.train` with the same flags, told their role by
TF_CONFIG (a "chief", the client, and one "worker" per stage); --num_workers
is not needed. The stage servers end when the client has; a stage that dies
ends the job as a dead worker does.

  python -m tfoverlap.launch -- --pipeline_stages=2 --pipeline_runtime=processes \
      --strategy=mirrored --num_devices=2 --pipeline_microbatches=4 --model=mlp

Each worker's (and stage server's) gRPC server listens on all interfaces,
not only on localhost: TensorFlow binds it to 0.0.0.0 and offers no bind
address. The launcher says so in one line, with the ports.
"""

import json
import os
import sys

from absl import app

import flags as tfo_flags
from overlap_core.runtime import network
from overlap_core.runtime import processes
from overlap_core.runtime import waits
# STOP_GRACE_S stays importable from here, where the launcher used to keep it.
from overlap_core.runtime.processes import STOP_GRACE_S, free_ports

tfo_flags.define_flags()

FRAMEWORK = "tensorflow"
PROGRAM = "tfoverlap.launch"


def exposure_warning(ports: list) -> str:
  """The one line that says what the workers expose to the network."""
  return network.exposure_warning(
      PROGRAM, "each worker's TensorFlow gRPC server",
      "ports " + ", ".join(str(p) for p in ports),
      "TensorFlow binds it to 0.0.0.0 and offers no bind address; run on "
      "a host whose firewall closes these ports to others")


def tf_config(ports: list, index: int) -> str:
  return json.dumps({
      "cluster": {"worker": [f"localhost:{p}" for p in ports]},
      "task": {"type": "worker", "index": index},
  })


def is_pipeline_job(trainer_args: list) -> bool:
  """Whether the trainer's flags ask for stage server processes."""
  return processes.flag_value(trainer_args, "pipeline_runtime") == "processes"


def pipeline_tf_config(ports: list, role: str, index: int) -> str:
  """TF_CONFIG of a pipeline job: ports[0] the client's, then a stage's
  each; `role` "chief" (the client) or "worker" (stage `index`)."""
  return json.dumps({
      "cluster": {"chief": [f"localhost:{ports[0]}"],
                  "worker": [f"localhost:{p}" for p in ports[1:]]},
      "task": {"type": role, "index": index},
  })


def build_pipeline_args(trainer_args: list, num_workers: int) -> list:
  """The trainer flags every process of a pipeline job runs with: the
  user's, and each process's share of the host's cores."""
  del num_workers  # the job is a client and a server per stage
  stages = int(processes.flag_value(trainer_args, "pipeline_stages") or 1)
  return processes.add_job_defaults(
      [a for a in trainer_args if not processes.has_flag([a], "num_workers")],
      framework=FRAMEWORK, num_processes=stages + 1)


def launch_pipeline(worker_args: list, num_stages: int,
                    module: str = "tfoverlap.train") -> int:
  """Starts the stage servers, then the client; supervises them all."""
  ports = free_ports(num_stages + 1)
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  argv = [sys.executable, "-m", module] + worker_args
  specs = [processes.ProcessSpec(
      argv=argv, env=dict(env, TF_CONFIG=pipeline_tf_config(ports, "worker",
                                                            k)))
           for k in range(num_stages)]
  # The client writes the job's one run.json (worker 0's place).
  specs.append(processes.ProcessSpec(
      argv=argv, env=dict(env, TF_CONFIG=pipeline_tf_config(ports, "chief",
                                                            0)),
      record_path=processes.record_path(worker_args, 0)))
  network.print_warning(network.exposure_warning(
      PROGRAM, "each stage server's TensorFlow gRPC server",
      "ports " + ", ".join(str(p) for p in ports),
      "TensorFlow binds it to 0.0.0.0 and offers no bind address; run on "
      "a host whose firewall closes these ports to others"))
  return processes.run_supervised(
      specs, program=PROGRAM,
      names=[f"stage {k}" for k in range(num_stages)] + ["client"])


def build_worker_args(trainer_args: list, num_workers: int) -> list:
  """The trainer flags every worker runs with."""
  args = [a for a in trainer_args
          if not processes.has_flag([a], "num_workers")]
  args += ["--strategy=multi_worker", f"--num_workers={num_workers}"]
  return processes.add_job_defaults(args, framework=FRAMEWORK,
                                    num_processes=num_workers)


def launch(num_workers: int, worker_args: list,
           module: str = "tfoverlap.train") -> int:
  """Starts the workers and supervises them; returns the job's status."""
  ports = free_ports(num_workers)
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  specs = [
      processes.ProcessSpec(argv=[sys.executable, "-m", module] + worker_args,
                            env=dict(env, TF_CONFIG=tf_config(ports, index)),
                            record_path=processes.record_path(worker_args,
                                                              index))
      for index in range(num_workers)
  ]
  network.print_warning(exposure_warning(ports))
  return processes.run_supervised(specs, program=PROGRAM, noun="worker")


def _check_supported(config) -> None:
  from tfoverlap import trainer  # pylint: disable=g-import-not-at-top
  trainer.check_supported(config)
  waits.collective_timeout_s()  # the workers read it from the environment


def parse_launcher_flags(argv):
  """Launcher flags before `--`; the trainer's after it, validated now.

  Returns:
    [program, *worker_args]: what `main` launches, already checked as the
    trainer will check it, so a bad flag exits 2 before any worker starts.
  """
  trainer_args = argv[argv.index("--") + 1:] if "--" in argv else []
  pipelined = is_pipeline_job(trainer_args)
  return tfo_flags.parse_launcher_argv(
      argv, build_worker_args=(build_pipeline_args if pipelined
                               else build_worker_args),
      check=_check_supported, counts_workers=lambda a: not pipelined)


def main(argv):
  if tfo_flags.FLAGS.pipeline_runtime == "processes":
    sys.exit(launch_pipeline(argv[1:], tfo_flags.FLAGS.pipeline_stages))
  sys.exit(launch(tfo_flags.FLAGS.num_workers, argv[1:]))


def run_main():
  app.run(main, flags_parser=parse_launcher_flags)


if __name__ == "__main__":
  run_main()
