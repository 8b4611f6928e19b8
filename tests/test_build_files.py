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
  test_files = {f[:-3].replace(os.sep, "_")
                for f in update_build.python_files(ROOT, "tests")
                if os.path.basename(f).startswith("test_")}
  assert test_files and names == test_files


def _write(root, path, text=""):
  full = os.path.join(root, path)
  os.makedirs(os.path.dirname(full), exist_ok=True)
  with open(full, "w", encoding="utf-8") as f:
    f.write(textwrap.dedent(text))


def _small_tree(root):
  """A project shaped like this one, small enough to reason about."""
  _write(root, "setup.py")
  _write(root, "overlap_core/__init__.py")
  _write(root, "overlap_core/runtime/__init__.py")
  _write(root, "overlap_core/runtime/zoo.py")
  _write(root, "flags/__init__.py", "from overlap_core.runtime import zoo\n")
  _write(root, "tfoverlap/__init__.py")
  _write(root, "tfoverlap/train.py",
         "import flags as tfo_flags\nfrom overlap_core.runtime import zoo\n")
  _write(root, "torch_parity/__init__.py")
  _write(root, "torch_parity/train.py", "import flags as tfo_flags\n")
  _write(root, "tests/conftest.py")
  _write(root, "tests/pytest_main.py")
  _write(root, "tests/overlap_core/test_runtime.py",
         "from overlap_core.runtime import zoo\n")
  _write(root, "tools/update_build.py")
  update_build.write(root)


def test_generated_libraries_follow_imports_one_way(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  assert 'deps = ["//overlap_core"]' in _build_text_at(root, "flags")
  assert ('deps = [\n        "//flags",\n        "//overlap_core",\n    ]'
          in _build_text_at(root, "tfoverlap"))
  assert "deps" not in _build_text_at(root, "overlap_core")
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
  # A test in a folder that mirrors a package is a target too.
  assert 'name = "overlap_core_test_runtime"' in tests_build


def test_a_file_a_library_ships_is_its_data(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  _write(root, "overlap_core/runtime/data/table.csv.gz")
  assert any("overlap_core/BUILD is stale" in p
             for p in update_build.find_problems(root))
  update_build.write(root)
  build = _build_text_at(root, "overlap_core")
  assert 'data = ["runtime/data/table.csv.gz"]' in build
  assert "table.csv.gz" not in build.split("data =")[0]  # not a source


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
  _write(root, "overlap_core/runtime/zoo.py", "import flags\n")
  update_build.write(root)
  problems = update_build.find_problems(root)
  assert any("cycle" in p and "//flags" in p and "//overlap_core" in p
             for p in problems)


def test_visibility_follows_the_layering_table(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  _write(root, "tests/test_layering.py",
         "ALLOWED_DEPS = {'overlap_core': (), 'flags': ('overlap_core',),\n"
         "                'tfoverlap': ('overlap_core', 'flags')}\n")
  update_build.write(root)
  assert ('visibility = [\n        "//flags:__pkg__",\n'
          '        "//tfoverlap:__pkg__",\n        "//tests:__pkg__",\n    ]'
          in _build_text_at(root, "overlap_core"))
  assert ('visibility = ["//tests:__pkg__"]'
          in _build_text_at(root, "tfoverlap"))


def test_the_real_libraries_are_visible_only_as_the_table_allows():
  assert '"//torch_parity:__pkg__"' not in _build_text("tfoverlap")
  assert '"//overlap_compare:__pkg__"' not in _build_text("tfoverlap")
  assert '"//torch_parity:__pkg__"' in _build_text("overlap_core")


def test_hand_edited_or_stray_build_file_is_reported(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  with open(os.path.join(root, "flags", "BUILD"), "a", encoding="utf-8") as f:
    f.write("# hand edit\n")
  _write(root, "overlap_core/runtime/BUILD")
  problems = update_build.find_problems(root)
  assert any(p.startswith("flags/BUILD is stale") for p in problems)
  assert any(p.startswith("overlap_core/runtime/BUILD is not one")
             for p in problems)


def test_check_mode_changes_nothing_and_fails(tmp_path):
  root = str(tmp_path)
  _small_tree(root)
  _write(root, "flags/run.py")
  before = _build_text_at(root, "flags")
  assert update_build.main(["--check", "--root", root]) == 1
  assert _build_text_at(root, "flags") == before
  assert update_build.main(["--root", root]) == 0
  assert '"run.py"' in _build_text_at(root, "flags")
