"""What both sides' planning tests check, written once.

Each side builds its own layer graphs (Keras layers, torch.fx nodes) and
runs its own `plan` command; the cut points and the command's report must
agree in kind. Each side's tests/<side>/test_planning.py calls these with
its graph or its package name and adds what only its framework says.
"""

import json
import os
from typing import Callable, Dict, Optional, Sequence, Tuple

from overlap_core.planning.graph import LayerGraph

from tests.helpers import run_module

# The job both plan commands are run on, refused or planned.
PLAN_JOB = ("--model=small_cnn", "--image_size=16", "--batch_size=16",
            "--strategy=mirrored", "--num_devices=2")


BlockOf = Callable[[str], Optional[str]]  # a node's name -> its block, if any


def block_ranges(graph: LayerGraph,
                 block_of: BlockOf) -> Dict[str, Tuple[int, int]]:
  """[first, last] node index of every block that `block_of` names."""
  ranges = {}
  for i, node in enumerate(graph.nodes):
    block = block_of(node.name)
    if block:
      first, _ = ranges.get(block, (i, i))
      ranges[block] = (first, i)
  return ranges


def check_resnet18_cuts_only_between_blocks(
    graph: LayerGraph, block_of: BlockOf, num_params: int) -> None:
  """resnet18's graph: 8 blocks, each cut once, between its residual add
  and the ReLU after it.

  Args:
    graph: the zoo's resnet18 at 32x32, batch 2.
    block_of: names the basic block ("layer1_0", "layer1.0") of a node.
    num_params: the model's parameter count.
  """
  cuts = set(graph.cut_points())
  blocks = block_ranges(graph, block_of)
  assert len(blocks) == 8  # 4 stages x 2 basic blocks
  for block, (first, last) in blocks.items():
    inside = {i for i in cuts if first <= i < last}
    # Inside a block the skip tensor crosses every boundary but the one
    # between the residual add and the ReLU after it.
    assert inside == {last - 1}, (block, [graph.nodes[i].name for i in inside])
    assert graph.nodes[last - 1].op_type == "add"
    assert last in cuts or last == len(graph.nodes) - 1
  assert graph.param_bytes == 4 * num_params
  assert LayerGraph.from_json(graph.to_json()) == graph


def check_inception_blocks_have_no_inner_cuts(
    graph: LayerGraph, block_of: BlockOf, concat_op: str) -> None:
  """inception_v3's 11 Mixed blocks (`block_of` names a node's) are cut
  only after their last node, the `concat_op` that joins their branches."""
  cuts = set(graph.cut_points())
  blocks = block_ranges(graph, block_of)
  assert len(blocks) == 11
  for block, (first, last) in blocks.items():
    assert not {i for i in cuts if first <= i < last}, block
    assert graph.nodes[last].op_type == concat_op and last in cuts


def run_plan_command(package: str, out_dir: str) -> dict:
  """`python -m <package>.plan` end to end on PLAN_JOB in 2 stages: its
  report, its files; the optimizer timed as the trainer runs it.

  Returns:
    The profile it wrote.
  """
  result = run_module(
      f"{package}.plan", *PLAN_JOB, "--pipeline_stages=2",
      "--pipeline_microbatches=2", "--plan_warmup=0", "--plan_repeats=1",
      "--plan_batch_sizes=4,8", f"--plan_output_dir={out_dir}", timeout=300)
  assert result.returncode == 0, result.stderr
  for needle in ("Layer graph small_cnn", "Profile of small_cnn",
                 "Cost model", "Split (auto, 2 stages", "Baseline: Split "
                 "(even", "GPipe bubble 33.3%"):
    assert needle in result.stdout
  with open(os.path.join(out_dir, "profile.json"), encoding="utf-8") as f:
    profile = json.load(f)
  assert profile["schema_version"] == 2
  # The trainer's default optimizer, timed on every layer with weights
  # (small_cnn: 4 convolutions and 2 dense layers).
  assert profile["optimizer"] == "adam" and len(profile["updates"]) == 6
  assert all(u["update_s"] > 0 for u in profile["updates"])
  assert 0 < profile["update_call_s"]
  assert "optimizer update (adam, once per step)" in result.stdout
  assert os.path.exists(os.path.join(out_dir, "graph.dot"))
  return profile


def check_plan_refusals(package: str,
                        refusals: Sequence[Tuple[Sequence[str], str]]) -> None:
  """Each (args, needle): the plan command on PLAN_JOB with `args` exits 2
  with one error line that says `needle`, and no traceback."""
  for args, needle in refusals:
    result = run_module(f"{package}.plan", *PLAN_JOB, *args, timeout=300)
    assert result.returncode == 2, result.stderr
    errors = [l for l in result.stderr.splitlines() if ": error: " in l]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    assert "Traceback" not in result.stderr
