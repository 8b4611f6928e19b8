"""A pipeline's stages are timed alone one rank at a time.

Real gloo ranks (torch.multiprocessing.spawn inside a subprocess with a
timeout, as the other multi-rank tests run): each times a small piece of
work through `reference_step._one_rank_at_a_time` and records when it ran
on the host's monotonic clock, which every process reads alike. No two
ranks' windows may overlap, and they run in rank order.
"""

import json
import sys
import time

import pytest
import torch

from torch_parity import reference_step, rendezvous

from tests.helpers import run_ranks_script

WORLD = 3
# Three processes starting torch and gloo on a loaded 2-core host.
RUN_TIMEOUT_S = 180


def _worker(rank: int, port: int, out_dir: str):
  torch.set_num_threads(1)
  rendezvous.init_process_group("gloo",
                                init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=WORLD)

  def time_alone():
    start = time.monotonic()
    a = torch.ones(64, 64)
    for _ in range(50):
      a = a @ a / 64
    return {"rank": rank, "start": start, "end": time.monotonic()}

  window = reference_step._one_rank_at_a_time(time_alone)  # pylint: disable=protected-access
  with open(f"{out_dir}/rank{rank}.json", "w", encoding="utf-8") as f:
    json.dump(window, f)
  torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
  out = tmp_path_factory.mktemp("in_turn")
  run_ranks_script(__file__, out, RUN_TIMEOUT_S)
  return [json.loads((out / f"rank{r}.json").read_text())
          for r in range(WORLD)]


def test_each_rank_times_its_own_work_after_the_one_before(windows):
  assert [w["rank"] for w in windows] == list(range(WORLD))
  for before, after in zip(windows, windows[1:]):
    assert before["end"] <= after["start"], (before, after)


if __name__ == "__main__":
  # The ranks: python test_reference_in_turn.py PORT DIR
  torch.multiprocessing.spawn(_worker, args=(int(sys.argv[1]), sys.argv[2]),
                              nprocs=WORLD)
