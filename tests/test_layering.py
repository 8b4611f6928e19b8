"""The packages depend on each other one way, and this file says which way.

The tables below are the project's layering, in one place: this test checks
every import (module-level and lazy ones inside functions) and every
`python -m` child process a library starts against them, and
`tools/update_build.py` reads the same tables (as data, from this file) to
write each library's Bazel visibility, so Bazel refuses the same edges.

The manual's map (docs/architecture.md) draws the same arrows; the
last test keeps the drawing and the tables in step.
"""

import ast
import os
import re

from tools import update_build

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

# Which of our libraries each may import. Dependencies run from the
# framework sides and the comparison down to the neutral core, never back
# up: a layer that imports one above it is tied to a layer that should be
# free to change.
ALLOWED_DEPS = {
    "overlap_core": (),
    "flags": ("overlap_core",),
    "tfoverlap": ("overlap_core", "flags"),
    "torch_parity": ("overlap_core", "flags"),
    "overlap_compare": ("overlap_core", "flags"),
}
# Which libraries each may start as a child process (`python -m lib.mod`),
# beyond those it may import. The comparison reaches the trainers only
# through their command lines, so it stays free of both frameworks.
ALLOWED_RUNS = {
    "overlap_compare": ("tfoverlap", "torch_parity"),
}
# Third-party modules a library must never import, at module level or
# lazily. The neutral core and the flags are shared by both frameworks and
# every install; the comparison runs where neither framework is installed.
FORBIDDEN_IMPORTS = {
    "overlap_core": ("tensorflow", "keras", "torch", "horovod", "matplotlib"),
    "flags": ("tensorflow", "keras", "torch", "horovod", "matplotlib"),
    "overlap_compare": ("tensorflow", "keras", "torch", "horovod"),
}


def _library_files(root: str) -> dict:
  """{library: its .py files relative to `root`}."""
  return {lib: [os.path.join(lib, f)
                for f in update_build.python_files(root, lib)]
          for lib in update_build.existing_libraries(root)}


def _owner(root: str, module: str, files_of: dict):
  """The library whose files importing `module` runs, or None."""
  owners = {f: lib for lib, files in files_of.items() for f in files}
  for f in update_build.module_files(root, module):
    if f in owners:
      return owners[f]
  return None


def _string_constants(tree: ast.Module) -> dict:
  """Module-level NAME = "text" assignments, for `-m NAME` lookups."""
  constants = {}
  for node in tree.body:
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)):
      for target in node.targets:
        if isinstance(target, ast.Name):
          constants[target.id] = node.value.value
  return constants


def child_module_targets(path: str) -> set:
  """Modules a file starts as `[..., "-m", MODULE, ...]` child processes.

  MODULE may be a string or a module-level constant holding one; that is
  how every launcher and runner in this project names its target.
  """
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  constants = _string_constants(tree)
  targets = set()
  for node in ast.walk(tree):
    if not isinstance(node, (ast.List, ast.Tuple)):
      continue
    items = node.elts
    for flag, target in zip(items, items[1:]):
      if not (isinstance(flag, ast.Constant) and flag.value == "-m"):
        continue
      if isinstance(target, ast.Constant) and isinstance(target.value, str):
        targets.add(target.value)
      elif isinstance(target, ast.Name) and target.id in constants:
        targets.add(constants[target.id])
  return targets


def test_the_tables_name_every_library_and_nothing_else():
  libraries = set(update_build.LIBRARIES)
  assert set(ALLOWED_DEPS) == libraries
  for table in (ALLOWED_DEPS, ALLOWED_RUNS, FORBIDDEN_IMPORTS):
    for lib, others in table.items():
      assert lib in libraries
      if table is not FORBIDDEN_IMPORTS:
        assert set(others) <= libraries - {lib}, lib


def import_problems(root: str) -> list:
  """Imports that break ALLOWED_DEPS or FORBIDDEN_IMPORTS, one line each.

  Module-level and lazy imports alike: both tie one layer to another.
  """
  files_of = _library_files(root)
  problems = []
  for lib, files in files_of.items():
    allowed = set(ALLOWED_DEPS.get(lib, ())) | {lib}
    forbidden = FORBIDDEN_IMPORTS.get(lib, ())
    for f in files:
      for module in update_build.imported_modules(os.path.join(root, f)):
        if module.split(".")[0] in forbidden:
          problems.append(f"{f} imports {module}; {lib} stays free of "
                          f"{', '.join(forbidden)}")
        owner = _owner(root, module, files_of)
        if owner is not None and owner not in allowed:
          # `from a import b` lists a and a.b: one line per library reached.
          problems.append(
              f"{f} imports {owner}: {lib} may import only "
              f"{', '.join(ALLOWED_DEPS.get(lib, ())) or 'nothing of ours'}")
  return sorted(set(problems))


def child_process_problems(root: str) -> tuple:
  """(problems, number of child targets seen) for `python -m` edges.

  `python -m` hides an edge from the import graph; it still ties the
  layers, so it is held to the same table, plus ALLOWED_RUNS.
  """
  files_of = _library_files(root)
  problems, seen = [], 0
  for lib, files in files_of.items():
    allowed = (set(ALLOWED_DEPS.get(lib, ())) | set(ALLOWED_RUNS.get(lib, ()))
               | {lib})
    for f in files:
      for module in child_module_targets(os.path.join(root, f)):
        seen += 1
        owner = _owner(root, module, files_of)
        if owner is not None and owner not in allowed:
          problems.append(f"{f} runs python -m {module}: {lib} may not "
                          f"start {owner}")
  return sorted(problems), seen


def test_every_import_follows_the_table():
  problems = import_problems(ROOT)
  assert not problems, "\n".join(problems)


def test_every_child_process_follows_the_table():
  problems, seen = child_process_problems(ROOT)
  # The launchers start trainers this way; finding none means the scan
  # itself broke, not that the layering holds.
  assert seen >= 2
  assert not problems, "\n".join(problems)


def _write(root, path, text=""):
  full = os.path.join(root, path)
  os.makedirs(os.path.dirname(full), exist_ok=True)
  with open(full, "w", encoding="utf-8") as f:
    f.write(text)


def _small_tree(root):
  for lib in ALLOWED_DEPS:
    _write(root, f"{lib}/__init__.py")
  _write(root, "tfoverlap/data.py")


def _import_problems_with(tmp_path, path, text):
  """What the import check finds in a small tree with `path` added."""
  root = str(tmp_path)
  _small_tree(root)
  _write(root, path, text)
  return import_problems(root)


def test_a_lazy_import_that_runs_back_up_is_found(tmp_path):
  # No cycle, but the PyTorch side reaching into the TensorFlow side, even
  # lazily inside a function, ties the two together.
  assert _import_problems_with(
      tmp_path, "torch_parity/data.py",
      "def read():\n  from tfoverlap import data\n") == [
      "torch_parity/data.py imports tfoverlap: torch_parity may import only "
      "overlap_core, flags"]


def test_the_neutral_core_importing_a_framework_is_found(tmp_path):
  assert _import_problems_with(tmp_path, "overlap_core/zoo.py",
                               "def f():\n  import torch\n") == [
      "overlap_core/zoo.py imports torch; overlap_core stays free of "
      "tensorflow, keras, torch, horovod, matplotlib"]


def test_a_child_process_that_runs_back_up_is_found(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  _write(root, "overlap_compare/plot.py")
  _write(root, "overlap_core/report.py",
         "import sys\nPLOT = 'overlap_compare.plot'\n"
         "argv = [sys.executable, '-m', PLOT]\n")
  _write(root, "overlap_compare/run.py",
         "import sys\nargv = [sys.executable, '-m', 'tfoverlap.data']\n")
  problems, seen = child_process_problems(root)
  assert seen == 2
  assert problems == ["overlap_core/report.py runs python -m "
                      "overlap_compare.plot: overlap_core may not start "
                      "overlap_compare"]


def test_the_scan_finds_a_child_process_by_constant(tmp_path):
  path = tmp_path / "runner.py"
  path.write_text("import sys\nTRAINER = 'torch_parity.train'\n"
                  "argv = [sys.executable, '-m', TRAINER, '--x']\n"
                  "other = (sys.executable, '-m', 'overlap_compare.cli')\n")
  assert child_module_targets(str(path)) == {"torch_parity.train",
                                             "overlap_compare.cli"}


def _readme_map() -> dict:
  """{library: the libraries its arrow names} from the manual's map."""
  with open(os.path.join(ROOT, "docs", "architecture.md"),
            encoding="utf-8") as f:
    text = f.read()
  block = re.search(r"## Where each overlap lives.*?```\n(.*?)```", text,
                    re.DOTALL)
  assert block, "docs/architecture.md lost its map of the packages"
  drawn = {}
  libraries = set(update_build.LIBRARIES)
  for line in block.group(1).splitlines():
    head = re.match(r"(\w+)/\s.*->(.*)", line)
    if head and head.group(1) in libraries:
      drawn[head.group(1)] = {w for w in re.findall(r"\w+", head.group(2))
                              if w in libraries}
  return drawn


def test_the_readme_map_draws_the_same_arrows():
  drawn = _readme_map()
  for lib, deps in ALLOWED_DEPS.items():
    assert drawn.get(lib) == set(deps), (
        f"docs/architecture.md's map draws {lib} -> {sorted(drawn.get(lib, ()))}; "
        f"the table allows {sorted(deps)}")
