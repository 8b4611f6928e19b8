"""The CPU-offload study's rows, models and batch search, framework-free.

`benchmarks.offload` runs them on PyTorch; `benchmarks.render` reads them
to lay out the results in the study's order without importing torch. The
rows are the OSU large-image study's five variants plus its future work,
the side-stream prefetch, in the order the study tabulates them.
"""

from typing import Callable, Optional

# Variant name: the `OffloadConfig` settings it adds to the targets, or None
# for no offload at all. Insertion order is the study's row order.
VARIANTS = {
    "baseline": None,
    "naive": {},
    "pinned": {"pin_memory": True},
    "non_blocking": {"non_blocking": True},
    "both": {"pin_memory": True, "non_blocking": True},
    "prefetch": {"pin_memory": True, "non_blocking": True, "prefetch": True},
}
# The batch search compares these two. Offload runs as `both`, not
# `prefetch`: the prefetch holds restored tensors on the device ahead of
# use, so its peak memory can exceed the baseline's and its limit would
# not say what offload itself makes room for.
WITHOUT_OFFLOAD = "baseline"
WITH_OFFLOAD = "both"
# The study's models: VGG-19, ResNet-50, Inception-V3, and
# Wide-ResNet-50-2 in place of AlexNet (a model of few, wide layers whose
# copies are large, where the study saw the optimizations help).
GPU_MODELS = ("vgg19", "resnet50", "inception_v3", "wide_resnet50_2")
CPU_MODELS = ("small_cnn", "resnet18")
# Models that older results files measured in a study model's place; the
# render puts each in its row position.
STAND_INS = {"vgg16": "vgg19"}
# What can cap the batch search, as the table names it.
CAP_REASONS = {"max_batch": "--max_batch",
               "host_memory": "the host-memory cap"}


def model_order(names) -> list:
  """`names` in the study's order, stand-ins in their model's place and
  any other model after them, by name."""
  def key(name):
    study_name = STAND_INS.get(name, name)
    if study_name in GPU_MODELS:
      return (GPU_MODELS.index(study_name), name)
    return (len(GPU_MODELS), name)
  return sorted(names, key=key)


def variant_order(names) -> list:
  """`names` (the variants a run recorded) in the study's row order."""
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    raise ValueError(f"variants={unknown}: unknown; allowed: "
                     f"{', '.join(VARIANTS)}")
  return [v for v in VARIANTS if v in names]


def search_largest_batch(fits: Callable[[int], bool], cap: int,
                         cap_reason: str = "max_batch") -> dict:
  """The largest batch for which `fits(batch)` holds, up to `cap`.

  Doubles the batch from 1 until a trial fails or the next size would pass
  the cap, tries the cap itself, then bisects between the last fit and the
  first failure to within a sixteenth of the fit (each trial is a whole
  training step at a large batch, and a run must stay within minutes).

  Args:
    fits: runs one training step at that batch; False when it runs out of
      memory.
    cap: the largest batch to try, at least 1.
    cap_reason: what set the cap, a key of CAP_REASONS; recorded.

  Returns:
    {"largest_batch": the largest batch that fit (0 if none),
     "first_oom": the smallest that failed, or None,
     "limit_found": False when every trial up to the cap fit, so the limit
       is at least the cap and not known,
     "cap": cap, "cap_reason": cap_reason}.

  Raises:
    ValueError: cap below 1, or an unknown cap_reason.
  """
  if cap < 1:
    raise ValueError(f"cap={cap}: allowed: at least 1")
  if cap_reason not in CAP_REASONS:
    raise ValueError(f"cap_reason={cap_reason!r}: allowed: "
                     f"{', '.join(CAP_REASONS)}")
  low, high = 0, None
  size = 1
  while size <= cap:
    if not fits(size):
      high = size
      break
    low = size
    size *= 2
  if high is None and low < cap:
    if fits(cap):
      low = cap
    else:
      high = cap
  if high is not None:
    while high - low > max(1, low // 16):
      middle = (low + high) // 2
      if fits(middle):
        low = middle
      else:
        high = middle
  return {"largest_batch": low, "first_oom": high,
          "limit_found": high is not None, "cap": cap,
          "cap_reason": cap_reason}


def describe_largest_batch(found: Optional[dict]) -> str:
  """One search result as the table shows it: the batch, or ">= cap" when
  the search reached its cap without running out of memory.

  Reads the fields `search_largest_batch` writes and those of older
  results files, whose capped searches recorded `capped_at` and the last
  power of two that fit as `largest_batch`.
  """
  if not found:
    return "not searched"
  if "limit_found" in found:
    limit_found, cap = found["limit_found"], found["cap"]
    reason = found.get("cap_reason", "max_batch")
  else:
    limit_found, cap = "capped_at" not in found, found.get("capped_at")
    reason = "max_batch"
  if limit_found:
    return (f"{found['largest_batch']} (first out of memory: "
            f"{found['first_oom']})")
  return (f"≥ {found['largest_batch']}: limit not found (search capped at "
          f"{cap} by {CAP_REASONS[reason]})")
