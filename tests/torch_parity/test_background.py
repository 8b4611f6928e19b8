"""--background_job in the PyTorch trainer: both sides' numbers in run.json."""

import os

import pytest

from tests.record_checks import check_background_job_beside_trainer


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")
def test_background_job_beside_the_trainer(tmp_path):
  check_background_job_beside_trainer("torch_parity.train", tmp_path / "run")
