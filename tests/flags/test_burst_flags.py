"""--burst_parallel, --amplification_limit, --background_job: validated once."""

import os

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.planning import burst
from overlap_core.planning.graph import chain
from overlap_core.planning.profile import LayerTiming, Profile
from overlap_core.runtime.config import (BurstConfig, ConfigError,
                                         check_burst_supported)

from tests.helpers import run_module
from tests.refusals import trainer_refusal, usage_error_line

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()

# Defaults: --model=small_cnn, batch 64 over --strategy=mirrored x 2 devices.


def _write_plan(tmp_path, *, num_devices=2, batch=64, limit=4.0, name="p",
                model="small_cnn"):
  graph = chain(model, [("a", "linear", {}), ("b", "relu", {})],
                batch_size=batch)
  timings = []
  for layer, fixed_s in (("a", 0.0), ("b", 1e-3)):
    for b in sorted({batch, -(-batch // 2), -(-batch // 4)}):
      timings.append(LayerTiming(layer, "x", b, fixed_s + 1e-5 * b, 0.0))
  profile = Profile(model="tiny", framework="synthetic", device="none",
                    warmup=0, repeats=1, timings=tuple(timings))
  plan = burst.plan_burst(graph, profile, global_batch=batch,
                          num_devices=num_devices, amplification_limit=limit)
  path = tmp_path / f"{name}.json"
  path.write_text(plan.to_json())
  return str(path), plan


def test_defaults_run_no_plan_and_no_background_job():
  with flagsaver.as_parsed():
    assert tfo_flags.to_config().burst == BurstConfig()


def test_a_plan_for_this_run_becomes_a_frozen_config(tmp_path):
  path, plan = _write_plan(tmp_path, limit=4.0)
  with flagsaver.as_parsed(burst_parallel=path, amplification_limit="4",
                           background_job="small_mlp"):
    cfg = tfo_flags.to_config().burst
  assert cfg == BurstConfig(plan_path=path, num_devices=2,
                            amplification_limit=4.0,
                            background_job="small_mlp")
  # Layer b scales badly: the limit case below bites.
  assert max(lp.amplification for lp in plan.layers) > 1.2


@pytest.mark.parametrize("case, message", [
    ("missing", "cannot read it"),
    ("not_json", "not a burst plan"),
    ("devices", "the plan is for 4 devices and this run has 2 replicas"),
    ("batch", "the plan is for a global batch of 32, not --batch_size=64"),
    ("model", "the plan is for model 'mlp', not --model=small_cnn"),
    ("limit", "of the plan amplifies"),
])
def test_a_plan_that_does_not_fit_the_run_is_refused(tmp_path, case, message):
  path, _ = _write_plan(tmp_path, limit=4.0)
  if case == "missing":
    path = str(tmp_path / "nowhere.json")
  elif case == "not_json":
    path = str(tmp_path / "bad.json")
    with open(path, "w", encoding="utf-8") as f:
      f.write("{")
  elif case == "devices":
    path, _ = _write_plan(tmp_path, num_devices=4, name="four")
  elif case == "batch":
    path, _ = _write_plan(tmp_path, batch=32, name="small")
  elif case == "model":
    path, _ = _write_plan(tmp_path, model="mlp", name="mlp")
  parsed = dict(burst_parallel=path,
                amplification_limit="1.2" if case == "limit" else "4")
  with flagsaver.as_parsed(**parsed):
    with pytest.raises(ConfigError) as raised:
      tfo_flags.to_config()
  assert message in str(raised.value)
  assert "\n" not in str(raised.value)


def test_more_devices_than_the_host_has_is_refused():
  cfg = BurstConfig(plan_path="p.json", num_devices=64)
  with pytest.raises(ConfigError, match="needs 64 devices and this host has "
                     "2 CPU cores"):
    check_burst_supported(cfg, host_devices=2, device_kind="CPU cores")
  check_burst_supported(BurstConfig(plan_path="p.json", num_devices=2),
                        host_devices=2, device_kind="CPU cores")


def test_a_plan_for_more_devices_than_the_host_has_exits_2(tmp_path):
  cores = os.cpu_count()
  # A power of two above the cores, so the batch divides over it.
  devices = 1 << cores.bit_length()
  batch = max(64, 2 * devices)
  path, _ = _write_plan(tmp_path, num_devices=devices, batch=batch,
                        limit=2.0)
  result = run_module("torch_parity.train", f"--burst_parallel={path}",
                      "--strategy=mirrored", f"--num_devices={devices}",
                      f"--batch_size={batch}",
                      f"--model_dir={tmp_path / 'run'}", timeout=300)
  assert (f"the plan needs {devices} devices and this host has {cores} "
          "CPU cores") in usage_error_line(result), result.stderr
  assert not (tmp_path / "run").exists()  # refused before any process ran


@pytest.mark.parametrize("module, extra", [
    ("tfoverlap.train", ("--loop=fit",)),
    ("torch_parity.train", ("--precision=mixed_bfloat16",)),
])
def test_trainers_refuse_a_plan_with_one_line(tmp_path, module, extra):
  path, _ = _write_plan(tmp_path, limit=2.0)
  line = trainer_refusal(module, [f"--burst_parallel={path}", *extra,
                                  f"--model_dir={tmp_path / 'run'}"])
  assert extra[0] in line or (
      "this host has" in line and os.cpu_count() < 2), line


# The TensorFlow trainer's command refuses a plan with exit status 2 and one
# line (the PyTorch trainer's is the test of a plan for too many devices).
def test_the_tensorflow_trainer_exits_2_on_a_plan_it_refuses(tmp_path):
  path, _ = _write_plan(tmp_path, limit=2.0)
  result = run_module("tfoverlap.train", f"--burst_parallel={path}",
                      "--loop=fit", f"--model_dir={tmp_path / 'run'}",
                      timeout=300)
  assert "--loop=fit" in usage_error_line(result), result.stderr


def test_a_limit_below_one_exits_2(capsys):
  # The planning command's own parser (app.run's flags_parser), in-process.
  with flagsaver.flagsaver():
    with pytest.raises(SystemExit) as exited:
      tfo_flags.parse_or_exit(["torch_parity.burst_plan",
                               "--amplification_limit=0.5"])
  assert exited.value.code == 2
  errors = capsys.readouterr().err.splitlines()
  assert len(errors) == 1 and "amplification_limit" in errors[0], errors
