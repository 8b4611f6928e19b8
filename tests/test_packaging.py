"""The sdist and wheel hold every package of the tree, and the wheel works.

The sdist is built from a copy of the tree, the wheel from the unpacked sdist
(as `pip install .` would from a fresh clone), and the wheel is installed into
a directory of its own, so nothing here writes into the checkout. All of it
runs offline, on this environment's setuptools.
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.helpers import REPO_ROOT
from tools import update_build

# Top-level packages that are part of the project but never installed.
NOT_INSTALLED = ("benchmarks", "examples", "tests", "tools")
# Directories that are never source: outputs, caches, environments.
_NOT_SOURCE = ("__pycache__", "build", "dist", "runs", "venv")


def _ignore_non_source(directory, names):
  return [n for n in names
          if os.path.isdir(os.path.join(directory, n))
          and (n.startswith((".", "bazel-")) or n in _NOT_SOURCE
               or n.endswith(".egg-info")
               or os.path.exists(os.path.join(directory, n, "pyvenv.cfg")))]


def _python_files(root, top):
  found = set()
  for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
    dirnames[:] = [d for d in dirnames if d != "__pycache__"]
    found.update(os.path.relpath(os.path.join(dirpath, f), root)
                 for f in filenames if f.endswith(".py"))
  return found


def _installable_modules(root):
  """Every module under a top-level package that setup.py should install."""
  modules = set()
  for name in os.listdir(root):
    if (name not in NOT_INSTALLED
        and os.path.isfile(os.path.join(root, name, "__init__.py"))):
      modules |= _python_files(root, name)
  return modules


def _package_data(root):
  """Every file a package reads at run time, as the BUILD files list it."""
  return {os.path.join(lib, f) for lib in update_build.existing_libraries(root)
          for f in update_build.package_data_files(root, lib)}


def _run(args, cwd):
  result = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  return result


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
  """(source copy, sdist path, wheel path)."""
  base = tmp_path_factory.mktemp("packaging")
  source = str(base / "source")
  shutil.copytree(REPO_ROOT, source, ignore=_ignore_non_source)
  sdist_dir = str(base / "sdist")
  # setuptools' own build hook, which is what `python -m build --sdist` calls.
  name = _run([sys.executable, "-c",
               "import sys, setuptools.build_meta as b; "
               "print(b.build_sdist(sys.argv[1]))", sdist_dir],
              cwd=source).stdout.strip().splitlines()[-1]
  sdist = os.path.join(sdist_dir, name)
  unpacked = str(base / "unpacked")
  with tarfile.open(sdist) as tar:
    # The safe extraction filter, where this Python has it (3.10.12 on).
    tar.extractall(unpacked, **({"filter": "data"}
                                if hasattr(tarfile, "data_filter") else {}))
  wheel_dir = str(base / "wheel")
  (top,) = os.listdir(unpacked)
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps",
        "--no-build-isolation", "--no-index", "--no-cache-dir", "--quiet",
        "--wheel-dir",
        wheel_dir, os.path.join(unpacked, top)], cwd=str(base))
  (wheel,) = os.listdir(wheel_dir)
  return source, sdist, os.path.join(wheel_dir, wheel)


def _version_in_source():
  with open(os.path.join(REPO_ROOT, "overlap_core", "__init__.py"),
            encoding="utf-8") as f:
    tree = ast.parse(f.read())
  (version,) = [node.value.value for node in tree.body
                if isinstance(node, ast.Assign)
                and [t.id for t in node.targets] == ["__version__"]]
  return version


def test_wheel_holds_every_package_and_nothing_else(dists):
  source, _, wheel = dists
  with zipfile.ZipFile(wheel) as zf:
    names = set(zf.namelist())
  in_wheel = {n for n in names if n.endswith(".py")}
  # The digits --dataset=digits reads among them.
  assert "overlap_core/runtime/data/digits.csv.gz" in _package_data(source)
  assert _package_data(source) <= names
  expected = _installable_modules(source)
  assert {"flags/__init__.py", "tfoverlap/__init__.py",
          "overlap_core/__init__.py", "overlap_core/runtime/__init__.py",
          "overlap_core/checkpoint/__init__.py",
          "overlap_core/planning/__init__.py",
          "overlap_compare/__init__.py", "torch_parity/__init__.py"
          } <= expected
  # A subdirectory without __init__.py, or a package left out of setup.py,
  # would be missing here; tests or benchmarks would be extra.
  assert in_wheel == expected


def test_sdist_is_a_source_release(dists):
  source, sdist, _ = dists
  with tarfile.open(sdist) as tar:
    # Names are "tfoverlap-<version>/<path>".
    in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
  # The Bazel files too, where the tree being packed has them (a Bazel test's
  # runfiles do not).
  bazel_files = set()
  for dirpath, _, filenames in os.walk(source):
    bazel_files.update(
        os.path.relpath(os.path.join(dirpath, f), source) for f in filenames
        if f in ("BUILD", "WORKSPACE", ".bazelrc") or f.endswith(".bzl"))
  needed = (_installable_modules(source) | _python_files(source, "tests")
            | bazel_files | _package_data(source)
            | {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md",
               "pytest.ini"})
  assert needed - in_sdist == set()
  assert not [n for n in in_sdist if n.endswith(".pyc")]


def test_version_is_declared_once(dists):
  source, sdist, wheel = dists
  version = _version_in_source()
  assert os.path.basename(sdist) == f"tfoverlap-{version}.tar.gz"
  assert os.path.basename(wheel).startswith(f"tfoverlap-{version}-")
  # No other module assigns a version, and setup.py computes its own.
  assigners = []
  for path in _installable_modules(source) | {"setup.py"}:
    with open(os.path.join(source, path), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    if any(isinstance(node, ast.Assign) and any(
        getattr(t, "id", None) == "__version__" for t in node.targets)
           for node in ast.walk(tree)):
      assigners.append(path)
    for node in ast.walk(tree):
      if isinstance(node, ast.keyword) and node.arg == "version":
        assert not isinstance(node.value, ast.Constant), path
  assert assigners == ["overlap_core/__init__.py"]
  with open(os.path.join(source, "pyproject.toml"), encoding="utf-8") as f:
    assert not re.search(r"^\s*version\s*=", f.read(), re.MULTILINE)


def test_installed_wheel_imports_and_its_commands_resolve(dists, tmp_path):
  _, _, wheel = dists
  target = str(tmp_path / "site")
  _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
        "--no-cache-dir",
        "--quiet", "--target", target, wheel], cwd=str(tmp_path))
  # From an unrelated directory, with only the installed copy on the path.
  check = (
      "import importlib, importlib.metadata as md, sys\n"
      "target = sys.argv[1]\n"
      "import flags, tfoverlap, torch_parity, overlap_compare\n"
      "import overlap_core.runtime.run_record as rr\n"
      "for m in (flags, tfoverlap, torch_parity, overlap_compare, rr):\n"
      "  assert m.__file__.startswith(target), m.__file__\n"
      "dist = md.distribution('tfoverlap')\n"
      "scripts = [e for e in dist.entry_points if e.group == 'console_scripts']\n"
      "assert sorted(e.name for e in scripts) == "
      "['tfoverlap-compare', 'tfoverlap-launch', 'tfoverlap-train'], "
      "scripts\n"
      "for e in scripts:\n"
      "  assert callable(e.load()), e\n"
      "from overlap_core.runtime import datasets\n"
      "assert datasets.DIGITS_FILE.startswith(target)\n"
      "assert len(datasets.load_digits_splits()['eval'][1]) == 360\n"
      "print(dist.version)\n")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["PYTHONPATH"] = target
  result = subprocess.run([sys.executable, "-c", check, target],
                          cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == _version_in_source()
