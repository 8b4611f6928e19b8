"""The verdict from ledger phases: thresholds, ties, unmeasured phases."""

import pytest

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime import verdict


def _phases(**fractions):
  return {name: {"fraction": value} for name, value in fractions.items()}


@pytest.mark.parametrize("fractions, expected, highly", [
    ({"data_wait": 0.049, "compute": 0.951}, verdict.COMPUTE_BOUND, False),
    ({"data_wait": 0.05, "compute": 0.95}, verdict.INPUT_BOUND, False),
    ({"data_wait": 0.25, "compute": 0.75}, verdict.INPUT_BOUND, True),
    ({"data_wait": 0.06, "checkpoint_stall": 0.08},
     verdict.CHECKPOINT_BOUND, False),
    ({"exposed_comm": 0.3, "data_wait": 0.1},
     verdict.COMMUNICATION_BOUND, True),
    ({"bubble": 0.4}, verdict.BUBBLE_BOUND, True),
    ({"offload": 0.23, "data_wait": 0.01}, verdict.OFFLOAD_BOUND, True),
    ({"contention": 0.12, "data_wait": 0.04}, verdict.CONTENTION_BOUND,
     False),
    # A wait with its own cause names the verdict before contention does.
    ({"contention": 0.30, "data_wait": 0.06}, verdict.INPUT_BOUND, False),
])
def test_the_largest_phase_past_the_cut_names_the_verdict(fractions, expected,
                                                          highly):
  found = verdict.step_verdict(_phases(**fractions))
  assert (found.verdict, found.highly) == (expected, highly)
  assert found.label.endswith(expected)
  assert found.label.startswith("highly ") == highly


def test_an_unmeasured_phase_cannot_bound_and_is_named():
  found = verdict.step_verdict(
      _phases(data_wait=0.0, compute=1.0),
      phases_measured=[ledger_lib.COMPUTE, ledger_lib.CHECKPOINT_STALL])
  assert found.verdict == verdict.COMPUTE_BOUND
  assert found.unmeasured == (ledger_lib.DATA_WAIT,)
  assert "not measured: data_wait" in found.describe()


def test_exposed_comm_is_a_share_of_its_own_in_progress_windows():
  clock = iter(float(t) for t in range(100))
  ledger = ledger_lib.StepLedger(clock=lambda: next(clock))
  ledger.add(ledger_lib.COMPUTE, 0.0, 6.0)
  ledger.add(ledger_lib.EXPOSED_COMM, 6.0, 8.0)
  ledger.end_step(1, num_samples=1, end_s=8.0)
  shares = ledger_lib.summarize_window(ledger.steps)
  assert shares["compute_fraction"] == pytest.approx(0.75)
  assert shares["exposed_comm_fraction"] == pytest.approx(0.25)
