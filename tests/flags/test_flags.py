"""The flag surface: frozen names, validation, one-line errors, flagfiles."""

import dataclasses

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime.config import AUTOTUNE, ConfigError

from tests.helpers import run_module

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()  # defaults, as a trainer sees them

# Changing this set is a decision about the user-facing surface: both
# trainers, the launcher and every flagfile in the wild read these names.
FROZEN_SURFACE = {
    "run": ["deterministic", "evaluate", "host_allocator", "inter_op_threads",
            "intra_op_threads", "log_every_steps", "loop", "model_dir",
            "paired_block_steps", "paired_removal", "progress",
            "reference_steps", "seed", "steps_per_execution",
            "tensorboard", "trace", "train_steps"],
    "model": ["learning_rate", "model", "optimizer", "precision"],
    "data": ["batch_size", "cache", "data_dir", "data_service", "dataset",
             "image_size", "map_parallelism", "num_classes", "prefetch",
             "prefetch_to_device", "preprocess_cost_ms", "shuffle_buffer",
             "synthetic_on_device", "tfds_name"],
    "distribute": ["all_reduce", "all_reduce_pack_mb", "num_devices",
                   "num_workers", "strategy"],
    "checkpoint": ["checkpoint", "checkpoint_every", "checkpoint_if_busy",
                   "checkpoint_keep", "checkpoint_max_overhead",
                   "checkpoint_on_error"],
    "pipeline": ["pipeline_microbatches", "pipeline_overlap_all_reduce",
                 "pipeline_runtime", "pipeline_schedule", "pipeline_split",
                 "pipeline_stages", "pipeline_stages_apart",
                 "pipeline_virtual_stages", "plan_profile"],
    "offload": ["offload", "offload_non_blocking", "offload_pin_memory",
                "offload_prefetch"],
    "burst": ["amplification_limit", "background_job", "burst_parallel"],
}


def test_flag_surface_is_frozen():
  assert tfo_flags.flag_names() == FROZEN_SURFACE


def test_define_flags_twice_is_harmless():
  tfo_flags.define_flags()
  assert tfo_flags.flag_names() == FROZEN_SURFACE


def test_defaults_are_the_main_job():
  with flagsaver.as_parsed():
    config = tfo_flags.to_config()
  assert config.model.name == "small_cnn"
  assert config.data.dataset == "digits"
  assert config.data.prefetch == AUTOTUNE  # prefetch on
  assert config.distribute.strategy == "mirrored"
  assert config.distribute.num_devices == 2


@pytest.mark.parametrize("text, expected", [("0", 0), ("3", 3),
                                            ("autotune", AUTOTUNE),
                                            ("AUTOTUNE", AUTOTUNE)])
def test_prefetch_depth_parses(text, expected):
  with flagsaver.as_parsed(prefetch=text):
    assert tfo_flags.to_config().data.prefetch == expected


@pytest.mark.parametrize("overrides, flag", [
    ({"prefetch": "-2"}, "prefetch"),
    ({"map_parallelism": "0"}, "map_parallelism"),
    ({"dataset": "tfds"}, "data_dir"),
    ({"batch_size": "63"}, "batch_size"),
    ({"synthetic_on_device": "true"}, "synthetic_on_device"),
    # (Features that do not combine, --loop=fit with synthetic_on_device or
    # --num_workers=2 with mirrored, are the compatibility table's:
    # tests/overlap_core/runtime/test_compat.py.)
    ({"data_service": "not an address"}, "data_service"),
    ({"model": "inception_v3"}, "image_size"),
    ({"model": "edsr", "image_size": "33"}, "image_size"),
    ({"data_dir": "/"}, "data_dir"),
    ({"offload": "activations,nope"}, "offload"),
    ({"offload": "none,activations"}, "offload"),
    ({"offload": "activations,activations"}, "offload"),
    ({"offload_pin_memory": "true"}, "offload_pin_memory"),
    ({"offload_prefetch": "true"}, "offload_prefetch"),
    # A blocking copy on the side stream waits for all queued compute.
    ({"offload": "activations", "offload_prefetch": "true"},
     "offload_prefetch"),
    # Checked by CheckpointConfig, which names the flag it came from.
    ({"checkpoint_every": "0"}, "checkpoint_every"),
    ({"checkpoint_every": "often"}, "checkpoint_every"),
    ({"checkpoint_keep": "0"}, "checkpoint_keep"),
    ({"checkpoint_max_overhead": "1.5"}, "checkpoint_max_overhead"),
])
def test_bad_values_name_the_flag(overrides, flag):
  with flagsaver.as_parsed(**overrides):
    with pytest.raises(ConfigError) as error:
      tfo_flags.to_config()
  assert error.value.flag == flag
  assert f"--{flag}=" in str(error.value)


@pytest.mark.parametrize("text, targets", [
    ("none", ()), ("activations", ("activations",)),
    ("parameters,activations", ("activations", "parameters")),
])
def test_offload_targets_parse(text, targets):
  with flagsaver.as_parsed(offload=text, offload_non_blocking="true"
                           if targets else "false"):
    config = tfo_flags.to_config().offload
  assert config.targets == targets
  assert config.enabled == bool(targets)
  assert config.non_blocking == bool(targets)


def test_config_is_frozen_and_serializable():
  with flagsaver.as_parsed():
    config = tfo_flags.to_config()
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.run.seed = 1
  assert config.to_dict()["data"]["batch_size"] == 64


@pytest.mark.parametrize("args, names", [
    (["--strategy=nope"], ["--strategy=nope", "mirrored"]),
    (["--batch_size=0"], ["--batch_size=0"]),
    (["--dataset=tfds", "--data_dir=/does/not/exist"],
     ["--data_dir=/does/not/exist", "directory"]),
    (["--dataset=image_folder"], ["--data_dir", "image_folder"]),
    (["--no_such_flag=1"], ["no_such_flag"]),
    (["stray_positional"], ["stray_positional"]),
    (["--checkpoint=async", "--checkpoint_keep=0"],
     ["--checkpoint_keep=0", "allowed: an integer >= 1"]),
])
def test_trainer_exits_2_with_one_line(args, names):
  result = run_module("tfoverlap.train", *args, timeout=120)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert "Traceback" not in result.stderr
  for name in names:
    assert name in lines[0]


def test_runtime_error_exits_1_with_one_line(capsys):
  error = OSError("No space left on device\n  while writing ckpt-0000000010")
  with pytest.raises(SystemExit) as exit_info:
    tfo_flags.exit_with_runtime_error("torch_parity.train", error)
  assert exit_info.value.code == tfo_flags.RUNTIME_ERROR_EXIT_CODE == 1
  assert capsys.readouterr().err == (
      "torch_parity.train: error: OSError: No space left on device\n")


def test_helpfull_lists_every_group(tmp_path):
  result = run_module("tfoverlap.train", "--helpfull", timeout=120)
  assert result.returncode == 0
  for names in FROZEN_SURFACE.values():
    for name in names:
      assert (f"--{name}:" in result.stdout or
              f"--[no]{name}:" in result.stdout), name


def test_flagfile_values_are_used(tmp_path):
  flagfile = tmp_path / "bad.flags"
  flagfile.write_text("--model=small_cnn\n--batch_size=0\n")
  result = run_module("tfoverlap.train", f"--flagfile={flagfile}",
                      timeout=120)
  assert result.returncode == 2
  assert "--batch_size=0" in result.stderr
