"""Every runnable command the docs and the README show names real flags."""

import glob
import os

import pytest

from tests.docs import doc_commands

ROOT = doc_commands.ROOT


def _documents():
  paths = [os.path.join(ROOT, "README.md")] + sorted(
      glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
  ) + sorted(glob.glob(os.path.join(ROOT, "examples", "*", "README.md")))
  for path in paths:
    with open(path, encoding="utf-8") as f:
      yield os.path.relpath(path, ROOT), f.read()


def _invocations():
  found = []
  for name, text in _documents():
    for line, code in doc_commands.runnable_blocks(text):
      for words in doc_commands.command_lines(code):
        for invocation in doc_commands.invocations(words):
          found.append((f"{name}:{line}", invocation))
  return found


@pytest.fixture(scope="module")
def invocations_and_flags():
  found = _invocations()
  modules = {inv.module for _, inv in found}
  modules |= {doc_commands.TRAINER_AFTER_DASHES[m] for m in modules
              if m in doc_commands.TRAINER_AFTER_DASHES}
  return found, doc_commands.module_flags(modules)


def test_every_runnable_flag_exists(invocations_and_flags):
  found, flags_of = invocations_and_flags
  bad = [f"{where}: python -m {inv.module} {flag}"
         for where, inv in found
         for flag in doc_commands.unknown_flags(inv, flags_of)]
  assert bad == [], "flags the commands' modules do not define:\n" + "\n".join(bad)


def test_the_docs_mark_the_tour_and_each_overlap_runnable(invocations_and_flags):
  found, _ = invocations_and_flags
  places = {where.split(":")[0] for where, _ in found}
  # The tour, and the pages whose commands a reader copies most.
  for page in ("README.md", "docs/getting-started.md",
               "docs/overlaps/several-hosts.md", "docs/comparing.md",
               "docs/planning.md", "examples/keras_mobilenet/README.md",
               "examples/keras_regression/README.md",
               "examples/torch_module/README.md"):
    assert page in places, f"{page} has no runnable block"
  assert len(found) >= 40, len(found)


def test_a_misspelt_flag_is_caught():
  [words] = doc_commands.command_lines(
      "python -m tfoverlap.launch --num_workers=2 -- --prefech=2 \\\n"
      "    --all_reduce=ring")
  launch, trainer = doc_commands.invocations(words)
  flags_of = {"tfoverlap.launch": frozenset({"num_workers"}),
              "tfoverlap.train": frozenset({"num_workers", "prefetch",
                                            "all_reduce"})}
  assert doc_commands.unknown_flags(launch, flags_of) == []
  assert doc_commands.unknown_flags(trainer, flags_of) == ["prefech"]
  [words] = doc_commands.command_lines(
      'python -m overlap_compare --matrix="prefech=0,2;checkpoint+'
      'checkpoint_every=sync+50" -- --train_steps=6  # a comment')
  compare, _ = doc_commands.invocations(words)
  flags_of["overlap_compare"] = frozenset({"matrix"})
  flags_of["tfoverlap.train"] |= {"checkpoint", "checkpoint_every"}
  assert doc_commands.unknown_flags(compare, flags_of) == ["matrix: prefech"]


def test_a_marker_without_a_block_is_refused():
  with pytest.raises(ValueError, match="not followed by a fenced block"):
    doc_commands.runnable_blocks("<!-- runnable -->\npython -m x\n")
