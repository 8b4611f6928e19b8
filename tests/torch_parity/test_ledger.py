"""`LoopLedger` on a module and a training loop written here, in process."""

import io
import os

import pytest
import torch

from overlap_core.runtime import ledger as ledger_lib
from overlap_core.runtime.config import ConfigError
from overlap_core.runtime.dir_lock import DirectoryInUseError
from tests.helpers import one_line_error
from tests import user_loop_compare
from torch_parity import trainer
from torch_parity.ledger import LoopLedger

BATCH = 4
BATCHES_PER_EPOCH = 4
EPOCHS = 2
STEPS = BATCHES_PER_EPOCH * EPOCHS
CHECKPOINT_EVERY = 2


class TinyNet(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.hidden = torch.nn.Linear(6, 8)
    self.out = torch.nn.Linear(8, 3)

  def forward(self, x):
    return self.out(torch.relu(self.hidden(x)))


def _loader():
  generator = torch.Generator().manual_seed(0)
  data = torch.utils.data.TensorDataset(
      torch.randn(BATCH * BATCHES_PER_EPOCH, 6, generator=generator),
      torch.randint(0, 3, (BATCH * BATCHES_PER_EPOCH,), generator=generator))
  return torch.utils.data.DataLoader(data, batch_size=BATCH)


def _train(root, name, checkpoint):
  """Two epochs of a plain loop; with `checkpoint`, a synchronous
  torch.save every CHECKPOINT_EVERY steps, after the step."""
  torch.manual_seed(0)
  model = TinyNet()
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
  stream = io.StringIO()
  with LoopLedger(os.path.join(root, name), model=model, batch_size=BATCH,
                  total_steps=STEPS, log_every_steps=4,
                  stream=stream) as ledger:
    for _ in range(EPOCHS):
      for inputs, targets in ledger.batches(_loader()):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        ledger.step(loss)
        if checkpoint and ledger.num_steps % CHECKPOINT_EVERY == 0:
          with ledger.checkpoint_stall():
            torch.save(model.state_dict(), os.path.join(root, f"{name}.pt"))
  return ledger, stream.getvalue(), model


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("loops"))
  return root, {"plain": _train(root, "plain", checkpoint=False),
                "checkpointed": _train(root, "checkpointed", checkpoint=True)}


def test_a_plain_loop_leaves_the_trainers_run_json(loops):
  record, output, model = user_loop_compare.check_plain_run(
      *loops, framework="pytorch", num_steps=STEPS,
      weights_digest=trainer.weights_digest)
  assert record["model"] == {
      "name": "TinyNet", "num_params": 83,
      "source": {"source": "user_loop", "value": f"{__name__}:TinyNet"}}
  assert record["phases_measured"] == list(ledger_lib.PHASES)
  assert record["phases"][ledger_lib.DATA_WAIT]["total"] > 0


def test_every_step_has_its_phases_and_the_save_is_its_stall(loops):
  _, runs = loops
  ledger, _, _ = runs["checkpointed"]
  steps = ledger._ctx.ledger.steps  # pylint: disable=protected-access
  assert [r.step for r in steps] == list(range(1, STEPS + 1))
  for r in steps:
    assert r.phases_s[ledger_lib.DATA_WAIT] > 0
    assert r.phases_s[ledger_lib.COMPUTE] > 0
    # Steps are chained and their phases lie inside them.
    assert sum(r.phases_s.values()) <= r.duration_s + 1e-9
  stalled = [r.step for r in steps
             if ledger_lib.CHECKPOINT_STALL in r.phases_s]
  assert stalled == list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))


def test_steps_marked_without_a_data_wait_end_at_their_last_mark(tmp_path):
  model = TinyNet()
  with LoopLedger(str(tmp_path / "run"), model=model, batch_size=BATCH,
                  progress=False) as ledger:
    for inputs, targets in _loader():
      loss = torch.nn.functional.cross_entropy(model(inputs), targets)
      ledger.step(loss)
  steps = ledger._ctx.ledger.steps  # pylint: disable=protected-access
  assert [r.step for r in steps] == [1, 2, 3, 4]
  assert all(ledger_lib.DATA_WAIT not in r.phases_s for r in steps)
  assert ledger.record["steps"] == 4


def test_an_error_in_the_loop_writes_nothing_and_lets_the_directory_go(
    tmp_path):
  directory = str(tmp_path / "run")
  with pytest.raises(ZeroDivisionError):
    with LoopLedger(directory, model=TinyNet(), batch_size=BATCH,
                    progress=False) as ledger:
      ledger.step(1.0)
      raise ZeroDivisionError
  assert not os.path.exists(os.path.join(directory, "run.json"))
  with LoopLedger(directory, model=TinyNet(), batch_size=BATCH,
                  progress=False) as ledger:
    # A second writer while this one holds the directory is refused.
    with pytest.raises(DirectoryInUseError):
      with LoopLedger(directory, model=TinyNet(), batch_size=BATCH):
        pass
    ledger.step(1.0)
  assert ledger.record["steps"] == 1


@pytest.mark.parametrize("kwargs, says", [
    ({"model": "net", "batch_size": 4}, "model='str'"),
    ({"model": None, "batch_size": 0}, "model='NoneType'"),
    ({"batch_size": 0}, "batch_size=0: allowed: an integer >= 1"),
    ({"batch_size": 4, "total_steps": 0}, "total_steps=0"),
])
def test_bad_arguments_are_refused_at_once(tmp_path, kwargs, says):
  kwargs.setdefault("model", TinyNet())
  message = one_line_error(LoopLedger, str(tmp_path), error=ConfigError,
                           **kwargs)
  assert says in message


def test_outside_its_block_a_mark_says_how_to_use_it(tmp_path):
  ledger = LoopLedger(str(tmp_path), model=TinyNet(), batch_size=BATCH)
  with pytest.raises(RuntimeError, match="inside `with LoopLedger"):
    ledger.step(1.0)


def test_overlap_compare_reads_the_runs(loops, tmp_path):
  rows = user_loop_compare.check_compared(
      str(tmp_path / "compare"), "pytorch", loops[0], "checkpointed")
  assert float(rows["baseline"]["data_wait_ms"]) > 0
  assert "pytorch" in rows["report"]
