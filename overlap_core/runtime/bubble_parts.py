"""A pipeline stage's idle time, taken apart into its causes.

A stage's step is its own work (stage_compute: forward and backward of its
micro-batches, the last stage's loss, its optimizer step) and its idle
time: waits on a neighbour (bubble) and point-to-point posting (transfer).
This module splits that idle time, per stage, from the per-stage medians
the runtimes record, with no framework in sight:

  fill_drain       the schedule's own term: one micro-batch's trip through
                   the other stages, sum over r != s of w_r / V. With equal
                   stages this is (S - 1) w / V, which over the step
                   (M + S - 1) w is the theory's (S - 1)/(V M + S - 1).
  imbalance        waiting on a slower neighbour beyond fill and drain: in
                   steady state the micro-batches arrive at the slowest
                   stage's pace, so (M - 1)(w_max - w_s) more.
  transfer         posting sends and receives, as measured (its own
                   clock, not modelled): `posting_ms` where the runtime
                   times it apart, else the whole `transfer_ms`.
  loss_and_update  waiting on the last stage's loss (once in the fill, and
                   on every micro-batch when the last stage is the slowest)
                   and on a neighbour's longer optimizer step before the
                   step ends together (max_r u_r - u_s).
  residual         measured idle minus the four parts above.

Here w_s is stage s's forward and backward of one micro-batch without the
loss, and its posting of that micro-batch's sends and receives where the
runtime times it apart: (compute - update - loss + posting) / M, from its
measured medians; the last stage's loss per micro-batch is l = loss / M;
u_s its update. Posting is on the path because a stage that posts is not
computing, and a neighbour waiting on it waits through both; on a loaded
host, where a stage can lose the CPU while it posts, it is a large part of
a slow stage's pace.

Why those terms: GPipe and 1F1B are max-plus recurrences; a micro-batch
leaves stage s when it left stage s - 1 and stage s finished the previous
one, so the step is sum_r w'_r + (M - 1) max_r w'_r (w' with the loss on
the last stage), and stage s idles that minus its own M w'_s. The first
sum is fill and drain, the rest imbalance (zero when balanced).

Transfer against waiting, and where they cannot be told apart: a wait on
a send (in the runtime's `transfer`) is, on gloo, mostly a wait for the
neighbour to post its receive, which a slower neighbour posts late; so the
PyTorch runtime times the posting apart, and only it is the transfer part,
the sends' waits falling to the modelled causes like any other wait.

What the residual holds, and so the tolerance (RESIDUAL_TOLERANCE_FRAC):
- wire time: gloo moves a tensor's bytes on its own thread, so a
  receive's wait holds both the neighbour's lateness and the copy's
  arrival, and a send's its neighbour's receive and the copy; gloo gives
  no clock between the two;
- the neighbours' transfers, which lie on the critical path and so make
  this stage wait, without being this stage's transfer;
- jitter: the steady-state pace is set by each micro-batch's slowest
  stage, not by the mean, so a noisy host idles more than the model says;
- forward and backward lumped into w: exact when one stage is the slowest
  both ways (a split whose imbalance is in its layers' work);
- the schedule's own bookkeeping, counted as compute.
On a shared 2-core host these stay within a fifth of a stage's step in
the runs this was written against; a larger residual says the model does
not describe the run (for example two stages sharing one thread pool,
which TensorFlow's single-process runtime does on the CPU).
"""

from typing import Dict, List, Optional, Sequence

FILL_DRAIN = "fill_drain"
IMBALANCE = "imbalance"
TRANSFER = "transfer"
LOSS_AND_UPDATE = "loss_and_update"
RESIDUAL = "residual"
PARTS = (FILL_DRAIN, IMBALANCE, TRANSFER, LOSS_AND_UPDATE)
# |residual| over the stage's step time above which the parts do not
# explain the measured idle time (see the module docstring for why).
RESIDUAL_TOLERANCE_FRAC = 0.2
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def split_idle(per_stage: Sequence[dict], *, schedule: str,
               micro_batches: int, virtual_stages: int = 1
               ) -> Optional[List[Dict[str, float]]]:
  """Each stage's idle time in parts, ms per step, in stage order.

  Args:
    per_stage: rows of `pipeline_stats.stage_entry` (compute_ms, bubble_ms,
      transfer_ms; update_ms and loss_ms where measured, else taken as 0).
    schedule, micro_batches, virtual_stages: as run.

  Returns:
    One dict per stage: idle_ms (bubble + transfer), step_ms, each of
    PARTS + "_ms", residual_ms and residual_fraction (of step_ms); None
    when the schedule has no closed form here or a row lacks its medians.
  """
  if schedule not in SCHEDULES or not per_stage:
    return None
  if micro_batches < 1 or virtual_stages < 1:
    raise ValueError(f"Invalid micro_batches/virtual_stages: "
                     f"{micro_batches}, {virtual_stages}; allowed: >= 1")
  rows = sorted(per_stage, key=lambda row: row["stage"])
  if any(row.get(k) is None for row in rows
         for k in ("compute_ms", "bubble_ms", "transfer_ms")):
    return None
  last = len(rows) - 1
  update = [row.get("update_ms") or 0.0 for row in rows]
  loss_total = rows[last].get("loss_ms") or 0.0
  loss = loss_total / micro_batches
  # A stage posting a send or a receive is not computing, and its
  # neighbours wait for it all the same: posting is on the micro-batch's
  # path through the stage, like its work (where it is timed apart).
  work = [(max(row["compute_ms"] - update[k]
               - (loss_total if k == last else 0.0), 0.0)
           + (row.get("posting_ms") or 0.0)) / micro_batches
          for k, row in enumerate(rows)]
  # w': the loss lies on the last stage's path of every micro-batch.
  path = [w + (loss if k == last else 0.0) for k, w in enumerate(work)]
  slowest = max(range(len(rows)), key=lambda k: path[k])
  steady = micro_batches - 1
  parts = []
  for k, row in enumerate(rows):
    fill_drain = (sum(work) - work[k]) / virtual_stages
    if k != last and slowest == last:
      # The last stage's pace is its work and its loss: the share of the
      # wait beyond a neighbour's work is the loss's.
      imbalance = steady * max(work[last] - work[k], 0.0)
      waits_on_loss = (loss / virtual_stages
                       + steady * (path[last] - path[k]) - imbalance)
    else:
      imbalance = steady * (path[slowest] - path[k])
      waits_on_loss = loss / virtual_stages if k != last else 0.0
    loss_and_update = waits_on_loss + (max(update) - update[k])
    idle = row["bubble_ms"] + row["transfer_ms"]
    # A replicated stage's exposed all-reduce is in its step, not idle on
    # a neighbour.
    step = row["compute_ms"] + idle + (row.get("exposed_comm_ms") or 0.0)
    transfer = row.get("posting_ms")
    if transfer is None:
      transfer = row["transfer_ms"]
    explained = fill_drain + imbalance + transfer + loss_and_update
    residual = idle - explained
    parts.append({
        "stage": row["stage"], "step_ms": step, "idle_ms": idle,
        f"{FILL_DRAIN}_ms": fill_drain, f"{IMBALANCE}_ms": imbalance,
        f"{TRANSFER}_ms": transfer,
        f"{LOSS_AND_UPDATE}_ms": loss_and_update,
        f"{RESIDUAL}_ms": residual,
        "residual_fraction": residual / step if step > 0 else None})
  return parts


def summarize(parts: Optional[Sequence[Dict[str, float]]]
              ) -> Optional[Dict[str, Optional[float]]]:
  """Each part's share of the stages' summed step time, and whether every
  stage's residual is within RESIDUAL_TOLERANCE_FRAC of its step."""
  if not parts:
    return None
  total = sum(p["step_ms"] for p in parts)
  if total <= 0:
    return None
  shares = {f"{name}_fraction": sum(p[f"{name}_ms"] for p in parts) / total
            for name in PARTS + (RESIDUAL,)}
  shares["idle_fraction"] = sum(p["idle_ms"] for p in parts) / total
  shares["explained"] = all(
      p["residual_fraction"] is not None and
      abs(p["residual_fraction"]) <= RESIDUAL_TOLERANCE_FRAC for p in parts)
  shares["residual_tolerance_fraction"] = RESIDUAL_TOLERANCE_FRAC
  return shares
