"""The Bazel BUILD files cover the source tree as it is, and stay generated.

CI runs this with the rest of the suite, so a module or test file added
without rerunning `python tools/update_build.py` fails CI even where Bazel
itself is not installed.
"""

import os
import re
import textwrap

from tools import update_build

# The checkout itself. Under Bazel this file runs from a runfiles tree that
# holds only what BUILD declares, which is the very thing being checked, so
# the link back to the source file leads to the tree to check against.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _build_text(path):
  with open(os.path.join(ROOT, path, "BUILD"), encoding="utf-8") as f:
    return f.read()


def test_committed_build_files_match_the_tree():
  problems = update_build.find_problems(ROOT)
  assert not problems, "\n".join(problems)


def test_every_library_module_is_in_a_py_library():
  for lib in update_build.existing_libraries(ROOT):
    listed = set(re.findall(r'"([\w/]+\.py)"', _build_text(lib)))
    on_disk = set(update_build.python_files(ROOT, lib))
    assert on_disk - listed == set(), f"{lib}/BUILD misses modules"
    assert listed - on_disk == set(), f"{lib}/BUILD lists absent modules"


def test_every_test_file_is_a_py_test():
  names = set(re.findall(r'py_test\(\n    name = "(\w+)"',
                         _build_text("tests")))
  test_files = {f[:-3] for f in os.listdir(os.path.join(ROOT, "tests"))
                if f.startswith("test_") and f.endswith(".py")}
  assert test_files and names == test_files


def _write(root, path, text=""):
  full = os.path.join(root, path)
  os.makedirs(os.path.dirname(full), exist_ok=True)
  with open(full, "w", encoding="utf-8") as f:
    f.write(textwrap.dedent(text))


def _small_tree(root):
  """A project shaped like this one, small enough to reason about."""
  _write(root, "setup.py")
  _write(root, "tfoverlap/__init__.py")
  _write(root, "tfoverlap/core/__init__.py")
  _write(root, "tfoverlap/core/zoo.py")
  _write(root, "tfoverlap/train.py",
         "import flags as tfo_flags\nfrom tfoverlap.core import zoo\n")
  _write(root, "flags/__init__.py", "from tfoverlap.core import zoo\n")
  _write(root, "tests/conftest.py")
  _write(root, "tests/pytest_main.py")
  _write(root, "tests/test_core.py", "from tfoverlap.core import zoo\n")
  _write(root, "tools/update_build.py")
  update_build.write(root)


def test_generated_libraries_follow_imports_without_a_cycle(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  flags_build = _build_text_at(root, "flags")
  tfoverlap_build = _build_text_at(root, "tfoverlap")
  # flags imports only the neutral core, so it must not depend on the part
  # of tfoverlap that imports flags back.
  assert 'deps = ["//tfoverlap:core"]' in flags_build
  assert '":core",\n        "//flags",' in tfoverlap_build
  assert update_build.find_problems(root) == []


def _build_text_at(root, path):
  with open(os.path.join(root, path, "BUILD"), encoding="utf-8") as f:
    return f.read()


def test_a_new_module_or_test_is_reported_until_regenerated(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  _write(root, "tfoverlap/data/__init__.py")
  _write(root, "tests/test_data.py")
  problems = update_build.find_problems(root)
  assert any("tfoverlap/BUILD is stale" in p for p in problems)
  assert any("tests/BUILD is stale" in p for p in problems)

  update_build.write(root)
  assert update_build.find_problems(root) == []
  assert '"data/__init__.py"' in _build_text_at(root, "tfoverlap")
  tests_build = _build_text_at(root, "tests")
  assert 'name = "test_data"' in tests_build
  assert 'args = ["$(rootpath test_data.py)"]' in tests_build


def test_unknown_python_directory_is_reported(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  _write(root, "jax_parity/__init__.py")
  problems = update_build.find_problems(root)
  assert len(problems) == 1 and problems[0].startswith("jax_parity/")


def test_import_cycle_between_libraries_is_reported(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  # The core now imports flags, which imports the core.
  _write(root, "tfoverlap/core/zoo.py", "import flags\n")
  update_build.write(root)
  problems = update_build.find_problems(root)
  assert any("cycle" in p and "//flags" in p and "//tfoverlap:core" in p
             for p in problems)


def test_hand_edited_or_stray_build_file_is_reported(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  with open(os.path.join(root, "flags", "BUILD"), "a", encoding="utf-8") as f:
    f.write("# hand edit\n")
  _write(root, "tfoverlap/core/BUILD")
  problems = update_build.find_problems(root)
  assert any(p.startswith("flags/BUILD is stale") for p in problems)
  assert any(p.startswith("tfoverlap/core/BUILD is not one") for p in problems)


def test_check_mode_changes_nothing_and_fails(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  _write(root, "flags/run.py")
  before = _build_text_at(root, "flags")
  assert update_build.main(["--check", "--root", root]) == 1
  assert _build_text_at(root, "flags") == before
  assert update_build.main(["--root", root]) == 0
  assert '"run.py"' in _build_text_at(root, "flags")
