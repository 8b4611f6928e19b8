"""One worker's outputs, written the same way by both trainers: its
directory, held for the run (`hold_worker_dir`), and at the end of the run
the Chrome trace, the TensorBoard directory's place, and run.json.

The framework sides pass in only what their framework knows (environment,
parameter count, strategy description, weights digest); the layout of the
files and of the record is decided here, once.
"""

import os
from typing import Iterable, Optional

from overlap_core.runtime import contention_split, dir_lock
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import paired_removal, replica_phases, run_record
from overlap_core.runtime import trace, user_code
from overlap_core.runtime.config import TrainConfig


def hold_worker_dir(out_dir: str) -> dir_lock.DirectoryLock:
  """Creates this worker's directory and makes this process its one writer.

  Taken before anything is built and released after run.json is written,
  so it covers every write of the run: checkpoints, the final save, the
  trace, TensorBoard and run.json.

  Every process that writes a worker's outputs holds that worker's
  directory (`run_record.worker_dir`): the chief the top one, worker i its
  `worker-i/`. Not the chief alone: a worker writes its own files, and
  may still be writing after the chief has ended and let the top go. A
  second whole job on the directory is still refused, at its chief (the
  top LOCK, which also covers `checkpoints/`, where only the chief writes)
  and at each of its workers; the launchers stop the rest of a job when
  one process exits 2.

  Raises:
    DirectoryInUseError: another run holds it (exit 2, naming the holder).
  """
  return dir_lock.acquire(out_dir, setting="--model_dir")


def write_worker_outputs(config: TrainConfig, out_dir: str,
                         ledger: ledger_lib.StepLedger, *, framework: str,
                         worker_index: int, num_workers: int,
                         environment: dict, strategy: dict, num_params: int,
                         weights_digest: str, final: dict,
                         phases_measured: Iterable[str],
                         checkpoint_stats: Optional[dict], notes: list,
                         wall_s: float,
                         offload_stats: Optional[dict] = None,
                         pipeline: Optional[dict] = None,
                         background_stats: Optional[dict] = None,
                         cpu_of_processes: Optional[tuple] = None,
                         phases_derived: Iterable[str] = (),
                         pairing: Optional[paired_removal.PairedRemoval] = None
                         ) -> dict:
  """Writes the trace (if asked for) and run.json of this worker.

  Args:
    config: the run's configuration, as it ran (model_dir filled in).
    out_dir: this worker's directory (`run_record.worker_dir`).
    ledger: the steps' timed phases.
    framework: "tensorflow" or "pytorch", as run.json names it.
    worker_index, num_workers: this worker among the run's workers.
    environment, strategy: run.json's sections of those names.
    num_params, weights_digest: what the framework reports of the model.
    final: the final losses and metrics.
    phases_measured: the ledger phases this loop really measures.
    checkpoint_stats: `CheckpointEngine.stats()`, or None.
    notes: plain-words notes for run.json.
    wall_s: the run's wall time so far.
    offload_stats: the offload copies (`Offloader.summary()`), or None.
    pipeline: the run.json `pipeline` section, or None when not pipelined.
    background_stats: `BackgroundRunner.stats()`, or None.
    cpu_of_processes: (work seconds per step, processes) when this
      worker's steps run in processes outside this one's tree (PyTorch's
      mirrored replicas): the summed work replaces the ledger's own.
    phases_derived: the ledger phases derived rather than timed step by
      step (TensorFlow's exposed all-reduce).
    pairing: the cause removed in alternate blocks of steps, or None.

  Returns:
    The record written to `<out_dir>/run.json`.
  """
  outputs = {}
  if config.run.trace:
    outputs["trace"] = trace.write_chrome_trace(
        os.path.join(out_dir, run_record.TRACE_NAME), ledger.spans,
        origin_s=ledger.origin_s, pid=worker_index,
        process_name=f"{framework} worker {worker_index}")
  if config.run.tensorboard:
    outputs["tensorboard"] = os.path.join(out_dir, "tensorboard")
  outputs["run_record"] = os.path.join(out_dir, run_record.RUN_RECORD_NAME)
  summary = ledger.summary()
  understated = contention_split.understated_note(summary["against_step_alone"])
  if understated:
    notes = [*notes, understated]
  notes = [*notes, *replica_phases.hidden_all_reduce_notes(
      summary["phases"], strategy)]
  if cpu_of_processes is not None:
    work_s, processes = cpu_of_processes
    summary["cpu"] = ledger_lib.cpu_summary(
        work_s, summary["phases"][ledger_lib.STEP]["mean"], processes)
  record = run_record.build_run_record(
      framework=framework,
      config=config.to_dict(),
      environment=environment,
      model_name=config.model.name,
      num_params=num_params,
      strategy=strategy,
      ledger_summary=summary,
      num_steps=len(ledger.steps),
      wall_s=wall_s,
      final=final,
      weights_digest=weights_digest,
      worker_index=worker_index,
      num_workers=num_workers,
      phases_measured=phases_measured,
      phases_derived=phases_derived,
      outputs=outputs,
      checkpoint=checkpoint_stats,
      notes=notes,
      offload=offload_stats,
      pipeline=pipeline,
      background=background_stats,
      steps_per_execution=config.run.steps_per_execution,
      model_source=user_code.model_origin(config.model.name).describe(),
      data_source=user_code.data_origin(config.data.dataset).describe(),
      paired_removal=pairing and paired_removal.summarize(
          pairing, ledger.steps, warmup_steps=summary["warmup_steps"]))
  run_record.write_run_record(out_dir, record)
  return record
