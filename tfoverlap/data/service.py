"""tf.data service: preprocessing moved off the trainer's input thread.

`--data_service=local` starts a dispatcher and one worker in this process,
addressed as localhost (`start_data_service`); any other non-empty value is
the address of a dispatcher someone else runs. Either way the batched
pipeline is sent to the service's workers and the trainer only reads
finished batches.

Exposed to the network: the dispatcher and the worker listen on every
interface, with no authentication, and a dispatcher runs whatever dataset
graph it is sent. TensorFlow's pip build offers no bind address
(`DispatcherConfig`/`WorkerConfig` have none) and no local-only credentials
(the `grpc+local` protocol is not registered), so this cannot be closed
here; `start_data_service` says so in one line on stderr, with the ports.

Usage:

  with start_data_service() as service:
    cfg = dataclasses.replace(cfg, data_service=service.address)
    input_fn = make_input_fn(cfg, split="train", task=..., seed=...)
"""

import collections
import threading

import tensorflow as tf

from overlap_core.runtime import network

# Every worker produces whole epochs and the consumers that name the same job
# share its stream: each batch goes to exactly one replica.
PROCESSING_MODE = "parallel_epochs"

_job_lock = threading.Lock()
_jobs_named = collections.Counter()


class LocalDataService:
  """A tf.data service dispatcher and one worker, in this process.

  Usage:

    service = LocalDataService()
    try:
      ...  # pipelines built with data_service=service.address
    finally:
      service.stop()
  """

  def __init__(self):
    service = tf.data.experimental.service
    self._dispatcher = service.DispatchServer(
        service.DispatcherConfig(port=0))
    host_port = self._dispatcher.target.split("://", 1)[-1]
    self._worker = service.WorkerServer(
        service.WorkerConfig(dispatcher_address=host_port))
    self._stopped = False

  @property
  def address(self) -> str:
    """The dispatcher address, e.g. "grpc://localhost:40123"."""
    return self._dispatcher.target

  @property
  def ports(self) -> list:
    """[dispatcher port, worker port]: what listens on every interface."""
    dispatcher = int(self.address.rsplit(":", 1)[1])
    # The worker's bound port has no public accessor (port=0 picks one).
    worker = getattr(self._worker, "_address", "")
    return [dispatcher] + ([int(worker.rsplit(":", 1)[1])] if worker else [])

  def stop(self) -> None:
    """Stops the worker, then the dispatcher; later calls do nothing."""
    if self._stopped:
      return
    self._stopped = True
    # The servers have no public stop: they are meant to live as long as the
    # process. A trainer (or a test) that starts several runs in one process
    # must free the ports and threads, so the private stop is used.
    self._worker._stop()  # pylint: disable=protected-access
    self._dispatcher._stop()  # pylint: disable=protected-access

  def __enter__(self) -> "LocalDataService":
    return self

  def __exit__(self, *exc_info) -> None:
    self.stop()


def exposure_warning(service: LocalDataService,
                     program: str = "tfoverlap.train") -> str:
  """The one line that says what a local service exposes to the network."""
  return network.exposure_warning(
      program, "the tf.data service (dispatcher and worker)",
      "ports " + ", ".join(str(p) for p in service.ports),
      "TensorFlow offers no bind address and no local-only credentials, and "
      "a dispatcher runs any dataset graph it is sent; use it only on a host "
      "whose firewall closes these ports to others")


def start_data_service(program: str = "tfoverlap.train") -> LocalDataService:
  """Starts a dispatcher and one worker on free ports, and warns on stderr
  that they listen on every interface."""
  service = LocalDataService()
  network.print_warning(exposure_warning(service, program))
  return service


def next_job_name(split: str, task: str, seed: int) -> str:
  """A job name for one pipeline, shared by the processes of one run.

  A finished job keeps its name: a new pipeline asking for that name reads
  nothing at all (seen with TF 2.21 when an evaluation pipeline was built a
  second time). So every call gets a fresh name. Counting calls per process
  makes the n-th pipeline of every worker process get the same name, so
  their replicas share one job instead of each reading its own copy.
  """
  key = f"tfoverlap_{split}_{task}_seed{seed}"
  with _job_lock:
    number = _jobs_named[key]
    _jobs_named[key] += 1
  return f"{key}_{number}"


def apply_data_service(ds: tf.data.Dataset, address: str,
                       job_name: str) -> tf.data.Dataset:
  """Hands everything before this point to the service at `address`.

  Raises:
    ValueError: address is "local" (start the service first and pass its
      address) or empty.
  """
  if not address or address == "local":
    raise ValueError(
        f"data_service={address!r}: pass the address of a running service, "
        "e.g. start_data_service().address, not 'local' or empty")
  return ds.apply(tf.data.experimental.service.distribute(
      processing_mode=PROCESSING_MODE, service=address, job_name=job_name))
