"""The offload benchmark's rows, models, flags and batch search, and one
tiny run on the CPU: what the study's table is made of."""

import json
import sys

import pytest
import torch

from benchmarks import offload
from benchmarks import offload_study
from overlap_core.runtime import zoo
from torch_parity import models as torch_models

STUDY_ROWS = ("baseline", "naive", "pinned", "non_blocking", "both",
              "prefetch")


def test_models_are_the_studys_and_in_both_zoos():
  assert offload_study.GPU_MODELS == (
      "vgg19", "resnet50", "inception_v3", "wide_resnet50_2")
  for name in offload_study.GPU_MODELS + offload_study.CPU_MODELS:
    assert name in zoo.MODEL_NAMES
  # VGG-19 proper, not VGG-16 under its name: 16 convolutions in stages of
  # 2, 2, 4, 4, 4 between the five poolings.
  with torch.device("meta"):
    model = torch_models.build_model("vgg19", image_size=32, num_classes=10)
  stages, convolutions = [], 0
  for module in model.features:
    if isinstance(module, torch.nn.Conv2d):
      convolutions += 1
    elif isinstance(module, torch.nn.MaxPool2d):
      stages.append(convolutions)
      convolutions = 0
  assert stages == [2, 2, 4, 4, 4]


def test_variants_are_the_study_rows_in_its_order():
  assert tuple(offload_study.VARIANTS) == STUDY_ROWS
  shuffled = ["prefetch", "both", "baseline", "pinned", "naive",
              "non_blocking"]
  assert offload_study.variant_order(shuffled) == list(STUDY_ROWS)
  # The CPU smoke records no pinned rows; the others keep their order.
  assert offload_study.variant_order(["prefetch", "naive", "baseline"]) == [
      "baseline", "naive", "prefetch"]
  with pytest.raises(ValueError, match="pinnned"):
    offload_study.variant_order(["baseline", "pinnned"])


@pytest.mark.parametrize("variant, pin, non_blocking, prefetch", [
    ("naive", False, False, False),
    ("pinned", True, False, False),
    ("non_blocking", False, True, False),
    ("both", True, True, False),
    ("prefetch", True, True, True),
])
def test_each_variant_sets_its_offload_knobs(variant, pin, non_blocking,
                                             prefetch):
  config = offload.offload_settings(variant, ("activations",), "cuda")
  assert config.targets == ("activations",)
  assert (config.pin_memory, config.non_blocking, config.prefetch) == (
      pin, non_blocking, prefetch)
  # Without CUDA nothing is pinned; the rest is as on the GPU.
  on_cpu = offload.offload_settings(variant, ("activations",), "cpu")
  assert (on_cpu.pin_memory, on_cpu.non_blocking, on_cpu.prefetch) == (
      False, non_blocking, prefetch)


def test_the_baseline_offloads_nothing():
  assert offload.offload_settings("baseline", ("activations",), "cuda") is None


def test_the_batch_search_compares_baseline_with_both():
  # `prefetch` holds restored tensors ahead of use; `both` is offload alone.
  assert offload_study.WITHOUT_OFFLOAD == "baseline"
  assert offload_study.WITH_OFFLOAD == "both"


def _search(limit, cap):
  tried = []

  def fits(batch):
    tried.append(batch)
    return batch <= limit

  return offload_study.search_largest_batch(fits, cap), tried


@pytest.mark.parametrize("limit", [1, 5, 100, 1000, 2047])
def test_the_search_finds_a_limit_below_the_cap(limit):
  found, tried = _search(limit, cap=4096)
  assert found["limit_found"]
  # To within a sixteenth of the fit, never above the limit.
  assert limit - max(1, limit // 16) <= found["largest_batch"] <= limit
  assert found["first_oom"] > limit
  assert max(tried) <= 4096


@pytest.mark.parametrize("cap", [2048, 3000])
def test_a_search_that_reaches_its_cap_says_the_limit_was_not_found(cap):
  found, tried = _search(limit=10**6, cap=cap)
  assert not found["limit_found"] and found["first_oom"] is None
  # The cap itself was tried, so "at least the cap" is what was shown.
  assert found["largest_batch"] == cap and cap in tried
  assert max(tried) == cap
  assert offload_study.describe_largest_batch(found).startswith(f"≥ {cap}:")


def test_a_cap_between_powers_of_two_is_bisected_below_it():
  found, _ = _search(limit=2500, cap=3000)
  assert found["limit_found"] and found["first_oom"] <= 3000
  assert 2500 - 2500 // 16 <= found["largest_batch"] <= 2500


def test_nothing_fits():
  found, tried = _search(limit=0, cap=64)
  assert tried == [1]
  assert found == {"largest_batch": 0, "first_oom": 1, "limit_found": True,
                   "cap": 64, "cap_reason": "max_batch"}


@pytest.mark.parametrize("cap, reason", [(0, "max_batch"), (8, "disk")])
def test_bad_search_arguments_are_refused_by_name(cap, reason):
  with pytest.raises(ValueError, match="cap"):
    offload_study.search_largest_batch(lambda batch: True, cap, reason)


def test_older_results_files_read_honestly():
  # A capped search of the older code: the last power of two that fit.
  capped = {"capped_at": 2048, "largest_batch": 2048}
  assert offload_study.describe_largest_batch(capped).startswith("≥ 2048:")
  found = {"largest_batch": 700, "first_oom": 720}
  assert offload_study.describe_largest_batch(found).startswith("700 ")
  assert offload_study.describe_largest_batch({}) == "not searched"


def test_models_render_in_the_studys_order_with_stand_ins_in_place():
  assert offload_study.model_order(
      ["wide_resnet50_2", "vgg16", "resnet50", "inception_v3"]) == [
          "vgg16", "resnet50", "inception_v3", "wide_resnet50_2"]
  assert offload_study.model_order(["resnet18", "small_cnn", "vgg19"]) == [
      "vgg19", "resnet18", "small_cnn"]


def test_summary_keeps_prefetches_per_step():
  copies = {d: {"tensors_per_step": 4.0, "mb_per_step": 2.0,
                "copy_ms": {"mean": 1.0, "max": 2.0, "min": 0.5,
                            "median": 0.9}}
            for d in ("to_host", "to_device")}
  rows = [{"total_s": t, "peak_device_mb": None,
           "copies": {**copies, "prefetched_tensors": 18}}
          for t in (3.0, 1.0, 2.0)]
  result = offload.summarize(rows, num_steps=6)
  assert result["total_s"] == 2.0
  assert result["prefetched_tensors"] == 18
  assert result["prefetched_tensors_per_step"] == 3.0
  assert result["to_host"]["min"] == 0.5


def test_a_cpu_row_really_offloads():
  settings = {"image_size": 8, "batch_size": 2, "steps": 2,
              "warmup_steps": 1}
  row = offload.run_variant("mlp", "naive", settings, torch.device("cpu"),
                            ("activations",))
  copies = row["copies"]
  assert copies["to_host"]["tensors"] > 0
  assert copies["to_device"]["tensors"] == copies["to_host"]["tensors"]
  baseline = offload.run_variant("mlp", "baseline", settings,
                                 torch.device("cpu"), ("activations",))
  assert "copies" not in baseline


def _help_entries(text: str) -> dict:
  """{flag: its help text} from argparse's options listing."""
  entries, flag = {}, None
  for line in text[text.index("options:"):].splitlines()[1:]:
    if line.startswith("  -"):
      head, _, described = line.strip().partition("  ")
      flag = head.split()[0].split("=")[0].rstrip(",")
      if flag == "-h":
        flag = "--help"
      entries[flag] = described.strip()
    elif flag and line.strip():
      entries[flag] = (entries[flag] + " " + line.strip()).strip()
  return entries


def test_help_describes_every_flag(capsys):
  with pytest.raises(SystemExit) as done:
    offload.parse_args(["--help"])
  assert done.value.code == 0
  text = capsys.readouterr().out
  entries = _help_entries(text)
  for flag in ("--device", "--models", "--modes", "--targets", "--image_size",
               "--batch_size", "--steps", "--max_batch", "--quick",
               "--repeats", "--output"):
    assert len(entries[flag].split()) >= 3, (flag, entries[flag])
  assert "not found" in entries["--max_batch"]
  assert "vgg19" in entries["--models"]


@pytest.mark.parametrize("argv, message", [
    (["--models=vgg19,resnet51"], "--models=vgg19,resnet51"),
    (["--targets=weights"], "--targets=weights"),
    (["--steps=0"], "--steps=0"),
    (["--max_batch=-1"], "--max_batch=-1"),
    (["--modes=baseline,pinnned"], "--modes=baseline,pinnned"),
    # Every ratio is to the baseline.
    (["--modes=naive,prefetch"], "--modes=naive,prefetch"),
    # The batch search's host-memory cap comes from the `both` row.
    (["--device=cuda", "--modes=baseline,prefetch"],
     "--modes=baseline,prefetch"),
])
def test_bad_flags_are_one_line_and_exit_2(capsys, argv, message):
  with pytest.raises(SystemExit) as done:
    offload.parse_args(argv)
  assert done.value.code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert message in error


def test_modes_runs_only_those_rows_in_the_studys_order(tmp_path,
                                                        monkeypatch):
  path = tmp_path / "offload.json"
  monkeypatch.setattr(sys, "argv", [
      "offload", "--device=cpu", "--models=mlp", "--modes=prefetch,baseline",
      "--image_size=8", "--batch_size=2", "--steps=1", "--repeats=1",
      "--redo_busy=0", f"--output={path}"])
  offload.main()
  payload = json.loads(path.read_text(encoding="utf-8"))
  assert payload["variants"] == ["baseline", "prefetch"]
  assert list(payload["results"]["mlp"]) == ["baseline", "prefetch"]
  assert payload["results"]["mlp"]["prefetch"]["to_host"]["mb_per_step"] > 0
  # No pinned row was asked for, so none is reported as skipped.
  assert not any("pinning" in s for s in payload["skipped"])


def test_without_a_search_modes_need_not_include_both():
  args = offload.parse_args(["--device=cuda", "--modes=baseline,prefetch",
                             "--max_batch=0"])
  assert args.modes == ["baseline", "prefetch"]
  assert offload.parse_args(["--device=cpu"]).modes == list(STUDY_ROWS)
