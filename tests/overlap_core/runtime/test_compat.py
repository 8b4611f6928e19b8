"""The compatibility table: every "no" refuses, every cheap "yes" trains.

Each row is checked through both trainers' `check_supported` in-process
(one real command line per framework shows the exit status 2 and the one
line); the combinations the table allows are trained for 2 steps with a
tiny MLP, in-process; and the docs' matrix is the rendered table.
"""

import itertools
import os
import re

import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime import compat, run_record
from overlap_core.runtime.compat_table import (BURST_PLAN, EXCLUSIVE,
                                               FEATURES, PT, ROWS, TF, Host)
from overlap_core.runtime.config import ConfigError

from tests.burst_plans import write_plan
from tests.helpers import REPO_ROOT, run_module

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()

BASE = {"model": "mlp", "dataset": "synthetic", "image_size": "8",
        "num_classes": "4", "batch_size": "8", "train_steps": "2",
        "evaluate": "false", "progress": "false", "trace": "false",
        "tensorboard": "false", "log_every_steps": "1",
        "strategy": "default", "intra_op_threads": "1"}
# (--inter_op_threads stays 0: PyTorch sets it once per process, and the
# "yes" runs share this one.)
MLP_LAYERS = ("fc1", "fc2", "fc3")


def _trainer(framework):
  # pylint: disable=g-import-not-at-top
  if framework == TF:
    from tfoverlap import trainer
  else:
    from torch_parity import trainer
  return trainer


def _build(names, tmp_path, **extra):
  """The config (and host) in which every feature of `names` holds."""
  values = dict(BASE, model_dir=str(tmp_path / "run"))
  host = Host(num_gpus=0)
  for name in names:
    values.update(FEATURES[name].example)
    host = FEATURES[name].host or host
  values.update(extra)
  if values.get("burst_parallel") == BURST_PLAN:
    replicas = int(values.get("num_workers", "1")) * (
        int(values.get("num_devices", "2"))
        if values["strategy"] == "mirrored" else 1)
    path = tmp_path / "burst.json"
    write_plan(path, {layer: replicas for layer in MLP_LAYERS},
               model="mlp", global_batch=int(values["batch_size"]),
               num_devices=replicas, iteration_s=0.01)
    values["burst_parallel"] = str(path)
  with flagsaver.as_parsed(**values):
    return tfo_flags.to_config(), host


def _alternatives(row):
  return list(itertools.product(*compat.row_features(row)))


def _row_id(row):
  return "+".join(s if isinstance(s, str) else s[0] for s in row.features)


def test_no_row_is_dead(tmp_path):
  """Each row's features can all hold at once, for every alternative."""
  for row in ROWS:
    for names in _alternatives(row):
      config, host = _build(names, tmp_path)
      for framework in row.frameworks:
        assert row in compat.matching_rows(config, framework, host=host), (
            names, framework)


@pytest.mark.parametrize(
    "row, framework",
    [(row, f) for row in ROWS for f in row.frameworks],
    ids=[f"{_row_id(row)}-{f}" for row in ROWS for f in row.frameworks])
def test_every_no_is_refused_by_the_trainer_in_one_line(row, framework,
                                                        tmp_path):
  config, host = _build(_alternatives(row)[0], tmp_path)
  with pytest.raises(ConfigError) as raised:
    _trainer(framework).check_supported(config, num_gpus=host.num_gpus)
  message = str(raised.value)
  first = compat.matching_rows(config, framework, host=host)[0]
  # The first matching row speaks (an earlier one may also hold).
  assert message == str(compat.refusal(first, config))
  assert "\n" not in message and "; allowed" in message
  assert message.startswith(f"--{first.flag}=")
  if first is row:
    assert row.reason.split("{")[0][:30] in message
  # Before the framework's import the same line, or none where a row that
  # names the host may speak first; before every such row, always the line.
  try:
    compat.check_without_host(config, framework)
  except ConfigError as early:
    assert str(early) == message
  else:
    assert any(FEATURES[n].host is not None
               for earlier in ROWS[:ROWS.index(first) + 1]
               if framework in earlier.frameworks
               for slot in compat.row_features(earlier) for n in slot), message


@pytest.mark.parametrize("framework, args, line", [
    (TF, ["--offload=activations", "--offload_pin_memory"],
     "--offload_pin_memory=True: TensorFlow allocates and pins"),
    (PT, ["--checkpoint=tf_async"],
     "--checkpoint=tf_async: TensorFlow's own asynchronous save"),
    (PT, ["--all_reduce=off"],
     "--all_reduce=off: --strategy=default has no all-reduce"),
])
def test_a_refused_command_line_exits_2_with_one_line(framework, args, line,
                                                      tmp_path):
  module = "tfoverlap.train" if framework == TF else "torch_parity.train"
  result = run_module(module, *(f"--{k}={v}" for k, v in BASE.items()),
                      *args, f"--model_dir={tmp_path}", timeout=180)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if ": error: " in l]
  assert len(errors) == 1 and line in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr


# The "yes" cells trained, chosen so: the features that run in this
# process in a second or two (one process, no GPU, no server, no plan), and
# of those every pair the table allows lands in at least one trained run,
# greedily packing as many allowed features into each run as the table
# lets (an all-pairs covering: about 10 TensorFlow runs, since 3
# strategies x 3 checkpoint modes need 9 at least, and 4 PyTorch ones; not
# one run per pair). Features needing processes (multi_worker, horovod, PyTorch's
# mirrored), a GPU, a data service, a burst plan or a background job are
# left to their own tests.
CHEAP = {
    TF: ("strategy=default", "strategy=one_device", "strategy=mirrored",
         "pipeline", "offload=activations", "checkpoint=sync",
         "checkpoint=async", "checkpoint=tf_async", "steps_per_execution>1",
         "loop=fit", "precision=mixed_bfloat16", "deterministic",
         "synthetic_on_device"),
    PT: ("strategy=default", "strategy=one_device", "offload=activations",
         "offload=parameters", "checkpoint=sync", "checkpoint=async",
         "precision=mixed_bfloat16", "deterministic", "synthetic_on_device"),
}


def _exclusive(a, b):
  return any(a in g and b in g for g in EXCLUSIVE)


def _accepted(names, framework, tmp_path):
  """The config of `names` if it builds and the trainer accepts it."""
  try:
    config, host = _build(names, tmp_path)
    _trainer(framework).check_supported(config, num_gpus=host.num_gpus)
  except ConfigError:
    return None
  if any(not FEATURES[n].holds(config, host) for n in names):
    return None  # one feature's example undid another's
  return config


def covering_runs(framework, tmp_path):
  """Runs (lists of features) covering every allowed pair of CHEAP."""
  cheap = CHEAP[framework]
  uncovered = {(a, b) for a, b in itertools.combinations(cheap, 2)
               if not _exclusive(a, b)
               and _accepted((a, b), framework, tmp_path) is not None}
  runs = []
  while uncovered:
    names = list(min(uncovered))
    # Add first the feature that covers the most pairs still uncovered.
    while True:
      gains = [(sum(tuple(sorted((c, n), key=cheap.index)) in uncovered
                    for n in names), c) for c in cheap
               if c not in names and not any(_exclusive(c, n) for n in names)]
      gains = sorted((g for g in gains if g[0]), reverse=True)
      added = next((c for _, c in gains if _accepted(
          names + [c], framework, tmp_path) is not None), None)
      if added is None:
        break
      names.append(added)
    uncovered -= {p for p in uncovered if set(p) <= set(names)}
    runs.append(names)
  return runs


def _undo_process_settings(framework):
  """--deterministic (and TensorFlow's --precision) is process-wide; the
  next run in this process must not inherit it."""
  # pylint: disable=g-import-not-at-top
  if framework == PT:
    import torch
    torch.use_deterministic_algorithms(False)
  else:
    from tests.tfoverlap.train_here import undo_process_settings
    undo_process_settings()


@pytest.mark.parametrize("framework", [TF, PT])
def test_every_cheap_yes_trains_two_steps(framework, tmp_path):
  trainer = _trainer(framework)
  runs = covering_runs(framework, tmp_path)
  assert len(runs) <= 12, runs  # the covering stays small
  for index, names in enumerate(runs):
    config = _accepted(names, framework, tmp_path / str(index))
    try:
      trainer.train(config)
    finally:
      _undo_process_settings(framework)
    record = run_record.load_run_record(config.run.model_dir)
    assert record["steps"] == 2, (names, record)


def test_the_docs_hold_the_rendered_matrix():
  page = compat.DOCS_PAGE
  with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as f:
    text = f.read()
  section = re.search(r"<!-- compat-matrix -->\n(.*?)<!-- /compat-matrix -->",
                      text, re.S)
  assert section, f"{page} lacks the compat-matrix markers"
  assert section.group(1) == compat.render_matrix(), (
      f"{page}'s matrix is stale: python -m overlap_core.runtime.compat")


def test_the_matrix_marks_a_refused_pair_per_framework():
  matrix = compat.render_matrix()
  row = next(l for l in matrix.splitlines() if l.startswith("| `pipeline` |"))
  names = list(FEATURES)
  cells = [c.strip() for c in row.strip("|").split("|")][1:]
  by_name = dict(zip(names, cells))
  assert by_name["loop=fit"].startswith("TF no")
  assert by_name["burst"].startswith("no")  # both frameworks
  assert by_name["deterministic"] == "yes"
