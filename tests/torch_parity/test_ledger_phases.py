"""The ledger's verdicts and its exposed all-reduce on real PyTorch runs.

Each run is a real trainer process, run once per module and shared by the
assertions about it.
"""

import statistics

import pytest

from overlap_core.runtime import contention
from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import run_record, verdict

from tests.helpers import run_module

QUIET = ["--progress=false", "--evaluate=false", "--trace=false",
         "--tensorboard=false", "--dataset=synthetic"]
# 3 ms of real CPU work per sample, made in series with the step (no
# prefetch, one call at a time): the input is most of every step.
INPUT_BOUND = ["--model=mlp", "--image_size=8", "--batch_size=8",
               "--strategy=default", "--train_steps=5", "--prefetch=0",
               "--map_parallelism=1", "--preprocess_cost_ms=3"]


def _train(tmp_path_factory, name, *args, **env):
  model_dir = tmp_path_factory.mktemp(name)
  result = run_module("torch_parity.train", f"--model_dir={model_dir}",
                      *QUIET, *args, timeout=600, **env)
  assert result.returncode == 0, result.stderr[-4000:]
  return result, run_record.load_run_record(str(model_dir))


@pytest.fixture(scope="module")
def input_bound_run(tmp_path_factory):
  return _train(tmp_path_factory, "input", *INPUT_BOUND)


@pytest.fixture(scope="module")
def resident_run(tmp_path_factory):
  # The same job, its batches kept on the device: the input is free. Its
  # steps take 0.75 to 3 ms and its wait for a resident batch about 4 us,
  # so what can make it "input-bound" (5% of the step) is a pause inside
  # those waits: the host taking the training thread off its core (up to
  # about 12 ms on a busy 2-core host, the scheduler's latency with two
  # runnable threads a core), or the garbage collector, which runs where
  # objects are made, as fetching a batch makes them. Over 55 measured
  # steps one such pause made the wait 5%, and over 590 steps of 0.75 ms
  # two did (clean-clone CI runs). Over 2390, 5% of the step is at least
  # 90 ms of waiting: seven such pauses, all landing in 10 ms of waits.
  return _train(tmp_path_factory, "resident", *INPUT_BOUND,
                "--synthetic_on_device", "--train_steps=2400")


@pytest.fixture(scope="module")
def reference_pair(tmp_path_factory):
  """One deterministic job with its step timed alone first (the default)
  and without, each with what ran beside every forward:
  (run.json, the live loader workers at each forward)."""
  job = ["--model=tests.user_models:torch_classifier_noting_loader_workers",
         "--image_size=8", "--batch_size=16", "--strategy=default",
         "--train_steps=6", "--deterministic"]
  runs = []
  for name, extra in (("reference", []),
                      ("no_reference", ["--reference_steps=0"])):
    log = tmp_path_factory.mktemp("forwards") / "workers.log"
    record = _train(tmp_path_factory, name, *job, *extra,
                    FORWARD_LOG=str(log))[1]
    runs.append((record, [int(n) for n in log.read_text().split()]))
  return runs


@pytest.fixture(scope="module")
def replica_runs(tmp_path_factory):
  """A small model on one DDP replica, a 6M-parameter one on two."""
  common = ["--model=mlp", "--batch_size=8", "--train_steps=6",
            "--strategy=mirrored", "--synthetic_on_device"]
  one = _train(tmp_path_factory, "one", *common, "--image_size=8",
               "--num_devices=1")
  two = _train(tmp_path_factory, "two", *common, "--image_size=64",
               "--num_devices=2")
  return one[1], two[1]


@pytest.fixture(scope="module")
def no_all_reduce_run(tmp_path_factory):
  """Two DDP replicas with the all-reduce off: each trains on its own."""
  return _train(tmp_path_factory, "no_all_reduce", "--model=mlp",
                "--image_size=8", "--batch_size=8", "--train_steps=2",
                "--strategy=mirrored", "--num_devices=2", "--all_reduce=off",
                "--synthetic_on_device")


# Rank 1's batch of 4 samples costs it 20 ms of CPU, in series with its
# step (no prefetch, no loader workers); rank 0's costs nothing.
SLOW_RANK_COST_MS = 5.0
SLOW_RANK_BATCH_MS = 4 * SLOW_RANK_COST_MS


@pytest.fixture(scope="module")
def slow_rank_run(tmp_path_factory):
  """Two DDP replicas, only the second waiting for its input."""
  return _train(tmp_path_factory, "slow_rank", "--model=mlp",
                "--image_size=8", "--batch_size=8", "--train_steps=8",
                "--strategy=mirrored", "--num_devices=2",
                "--dataset=tests.user_models:torch_images_slow_on_rank_1",
                "--prefetch=0", "--map_parallelism=1",
                SLOW_RANK_COST_MS=str(SLOW_RANK_COST_MS))[1]


def test_a_job_made_input_bound_is_called_input_bound(input_bound_run):
  result, record = input_bound_run
  assert record["verdict"]["verdict"] == verdict.INPUT_BOUND
  assert record["verdict"]["phase"] == ledger_lib.DATA_WAIT
  assert record["verdict"]["fraction"] >= verdict.BOUND_FRAC
  assert "verdict: " in result.stdout and "input-bound" in result.stdout


def test_the_same_job_with_resident_data_is_not(resident_run):
  result, record = resident_run
  assert record["verdict"]["verdict"] != verdict.INPUT_BOUND
  assert (record["phases"][ledger_lib.DATA_WAIT]["fraction"]
          < verdict.BOUND_FRAC)
  assert "input-bound" not in result.stdout


def test_exposed_comm_is_near_zero_on_one_replica_positive_on_two(
    replica_runs):
  one, two = replica_runs
  for record in (one, two):
    assert ledger_lib.EXPOSED_COMM in record["phases_measured"]
    phases = record["phases"]
    parts = sum(phases[p]["mean"] for p in phases
                if p not in (ledger_lib.STEP,))
    assert parts == pytest.approx(phases[ledger_lib.STEP]["mean"], rel=1e-6)
  # One replica reduces nothing over a wire: what is left is DDP's own
  # averaging of a 1 MB bucket, the copy back and the hand-over to gloo's
  # thread (seen on a quiet host: 0.4 ms, 8% of a 5 ms step; a busy one
  # delays the hand-over, up to a third of the step in the suite). Two
  # replicas' 25 MB of gradients cross gloo's loopback after backward's
  # last gradient, and the step waits for them: milliseconds more, on a
  # quiet host or a busy one. No share is asserted for one replica: a
  # share of a step this short measures the host's load.
  one_ms = one["phases"][ledger_lib.EXPOSED_COMM]["mean"]
  two_ms = two["phases"][ledger_lib.EXPOSED_COMM]["mean"]
  assert two_ms > 1e-3
  assert two_ms > one_ms


def test_a_run_without_all_reduce_records_no_exposed_comm(resident_run):
  _, record = resident_run
  assert ledger_lib.EXPOSED_COMM not in record["phases"]
  assert ledger_lib.EXPOSED_COMM not in record["phases_measured"]


def test_with_the_all_reduce_off_replicas_part_and_wait_for_nothing(
    no_all_reduce_run):
  _, record = no_all_reduce_run
  digests = record["strategy"]["replica_weights_digests"]
  # Each replica stepped on its own shard's gradients: two models.
  assert len(digests) == 2 and digests[0] != digests[1]
  assert digests[0] == record["weights_digest"]  # rank 0 wrote run.json
  assert ledger_lib.EXPOSED_COMM in record["phases_measured"]
  # No bucket reached the all-reduce, so no step waited for one.
  assert record["phases"][ledger_lib.EXPOSED_COMM]["mean"] < 1e-4


def test_timing_the_step_alone_first_changes_nothing_it_trains(
    reference_pair):
  (timed, _), (untimed, _) = reference_pair
  # Weights, BatchNorm statistics, optimizer state and random streams are
  # put back after the calibration's steps: the same bits.
  assert timed["weights_digest"] == untimed["weights_digest"]
  assert timed["final"]["train_loss"] == untimed["final"]["train_loss"]
  reference = timed["strategy"]["reference_step"]
  assert len(reference["step_ms"]) == timed["flags"]["run"]["reference_steps"]
  # Timed again after the loop, restored the same way (the digest above);
  # the lower median is the reference.
  assert (len(reference["later_step_ms"])
          == timed["flags"]["run"]["reference_steps"])
  assert reference["reference_ms"] == pytest.approx(min(
      statistics.median(reference["step_ms"]),
      statistics.median(reference["later_step_ms"])))
  assert reference["with_all_reduce"] is True  # one process: none to pause
  assert timed["phases_derived"] == [ledger_lib.CONTENTION]
  assert timed["phases"][ledger_lib.CONTENTION]["mean"] >= 0.0
  # Without a reference there is nothing to measure contention against.
  assert untimed["phases_derived"] == []
  assert ledger_lib.CONTENTION not in untimed["phases"]
  assert "reference_step" not in untimed["strategy"]


def test_the_step_alone_is_timed_before_the_loader_starts(reference_pair):
  (timed, timed_workers), (_, untimed_workers) = reference_pair
  # The loader's workers run (prefetch on) through training: every
  # training forward has them beside it.
  assert min(timed_workers[-timed["steps"]:]) > 0
  # The calibration's warm-up and timed forwards ran before the loader
  # existed, so none of its workers filled its queues beside them.
  calibration = (contention.WARMUP_CALLS
                 + timed["flags"]["run"]["reference_steps"])
  assert timed_workers.count(0) == untimed_workers.count(0) + calibration
  assert timed_workers == sorted(timed_workers)


def test_a_ddp_step_carves_exposed_comm_then_contention(replica_runs):
  _, two = replica_runs
  assert two["phases_derived"] == [ledger_lib.CONTENTION]
  assert ledger_lib.EXPOSED_COMM in two["phases_measured"]
  # The step alone is timed with DDP's all-reduce paused: what the
  # buckets' all-reduce costs backward beside the wait is contention.
  assert two["strategy"]["reference_step"]["with_all_reduce"] is False
  assert two["phases"][ledger_lib.CONTENTION]["mean"] >= 0.0


def test_a_replica_waiting_for_a_peers_input_counts_it_as_data_wait(
    slow_rank_run):
  phases = slow_rank_run["phases"]
  moved = slow_rank_run["strategy"]["phases_over_replicas"][
      ledger_lib.DATA_WAIT]
  # Rank 0 (its record) had its own batches at once, reached the
  # all-reduce first and waited there for rank 1's: exposed_comm in its
  # own ledger, data wait once the replicas' waits are exchanged. The
  # step would shorten by rank 1's wait less how much slower rank 0's
  # compute ran: a millisecond-sized MLP's, against 20 ms of input, so
  # half of it is a floor that a busy host's jitter does not reach, and
  # rank 0's own wait alone (a fraction of a millisecond) is far below it.
  floor_ms = SLOW_RANK_BATCH_MS / 2
  assert moved["into_ms_mean"] >= floor_ms
  assert 1e3 * phases[ledger_lib.DATA_WAIT]["mean"] >= floor_ms
  assert (phases[ledger_lib.DATA_WAIT]["mean"]
          > phases[ledger_lib.EXPOSED_COMM]["mean"])
  # What moved left exposed_comm: the phases still add up to the step.
  parts = sum(phases[p]["mean"] for p in phases if p != ledger_lib.STEP)
  assert parts == pytest.approx(phases[ledger_lib.STEP]["mean"], rel=1e-6)
  # A wait that bounds the run says that its removal may save less.
  [note] = [n for n in slow_rank_run["notes"]
            if n.startswith(f"{ledger_lib.DATA_WAIT} is ")]
  assert "--paired_removal=input measures the saving" in note


def test_one_replica_moves_nothing_between_its_phases(replica_runs):
  one, two = replica_runs
  # One replica has no peer to wait for: nothing to exchange.
  assert "phases_over_replicas" not in one["strategy"]
  # Two with resident batches wait for no input, theirs or a peer's. The
  # replicas' wait is never more than the longer of their own (max of
  # wait + compute is at most max wait + max compute), which here is a
  # resident batch's hand-over: well under a millisecond.
  moved = two["strategy"]["phases_over_replicas"][ledger_lib.DATA_WAIT]
  assert moved["into_ms_mean"] < 1.0

