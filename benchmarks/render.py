"""Regenerates the numbers of the benchmark pages from benchmarks/results/*.json.

  python -m benchmarks.render           # rewrite every block in place
  python -m benchmarks.render --check   # exit 1, naming the stale blocks

The pages are the manual's `docs/benchmarks/*.md`, one per benchmark
(BENCHMARKS.md at the top is their index and holds no table).

A rendered block is everything between `<!-- render: NAME -->` and
`<!-- /render -->`; NAME is a table of `benchmarks.render_tables`, which
reads the results files and nothing else. Prose outside the blocks carries
no figure that a block does not also show, so that rerunning a benchmark
and then this script is all it takes to bring the document up to date.
"""

import argparse
import glob
import os
import re
import sys
from typing import Callable, Dict, List

from benchmarks import render_tables
# Imported for its side effect: it registers its tables.
from benchmarks import render_tables_ledger  # noqa: F401
from benchmarks import render_tables_parallel  # noqa: F401
from benchmarks import render_tables_soak  # noqa: F401
from benchmarks import render_tables_stages  # noqa: F401
from benchmarks import render_tables_user_model  # noqa: F401

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS_GLOB = os.path.join(REPO_ROOT, "docs", "benchmarks", "*.md")

_BLOCK = re.compile(
    r"(?P<open><!-- render: (?P<name>[a-z0-9_]+) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- /render -->)", re.DOTALL)
_ANY_MARKER = re.compile(r"<!-- /?render\b")


class RenderError(ValueError):
  """The document's blocks are malformed or name no known table."""


def documents() -> List[str]:
  """The pages that hold rendered blocks, in order."""
  return sorted(glob.glob(DOCUMENTS_GLOB))


def read_documents() -> str:
  """Every page's text, one after another: the blocks of them all."""
  texts = []
  for path in documents():
    with open(path, encoding="utf-8") as f:
      texts.append(f.read())
  return "\n".join(texts)


def block_names(text: str) -> List[str]:
  return [m.group("name") for m in _BLOCK.finditer(text)]


def _check_markers(text: str) -> None:
  """Every marker belongs to a well-formed block; none is left dangling."""
  matched = sum(2 for _ in _BLOCK.finditer(text))
  found = len(_ANY_MARKER.findall(text))
  if found != matched:
    raise RenderError(f"{found} render markers but {matched // 2} complete "
                      "blocks: every `<!-- render: NAME -->` needs its own "
                      "`<!-- /render -->` and no nesting")


def render_text(text: str,
                tables: Dict[str, Callable[[], str]] = None) -> str:
  """The document with every block's body replaced by its table.

  Raises:
    RenderError: a block names no table, or the markers do not pair up.
  """
  tables = render_tables.TABLES if tables is None else tables
  _check_markers(text)
  unknown = [n for n in block_names(text) if n not in tables]
  if unknown:
    raise RenderError(f"unknown render block(s) {unknown}; known: "
                      f"{', '.join(sorted(tables))}")

  def replace(match):
    body = tables[match.group("name")]().rstrip("\n") + "\n"
    return match.group("open") + body + match.group("close")

  return _BLOCK.sub(replace, text)


def stale_blocks(text: str, tables: Dict[str, Callable[[], str]] = None
                 ) -> List[str]:
  """Names of the blocks whose body differs from what the files give."""
  rendered = render_text(text, tables)
  old = {m.group("name"): m.group("body") for m in _BLOCK.finditer(text)}
  new = {m.group("name"): m.group("body") for m in _BLOCK.finditer(rendered)}
  return [name for name in old if old[name] != new[name]]


def main(argv: List[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--check", action="store_true",
                      help="Change nothing; exit 1 if a block is stale.")
  parser.add_argument("--document", action="append",
                      help="A page to render (repeatable); default: every "
                           "docs/benchmarks/*.md.")
  args = parser.parse_args(argv)
  paths = args.document or documents()
  try:
    texts = {}
    for path in paths:
      with open(path, encoding="utf-8") as f:
        texts[path] = f.read()
    if args.check:
      stale = {path: stale_blocks(text) for path, text in texts.items()}
      stale = {path: names for path, names in stale.items() if names}
      for path, names in stale.items():
        print(f"{path}: stale blocks {names}; run python -m "
              "benchmarks.render", file=sys.stderr)
      return 1 if stale else 0
    rendered = {path: render_text(text) for path, text in texts.items()}
  except (OSError, RenderError, render_tables.MissingResults) as e:
    print(f"render: {e}", file=sys.stderr)
    return 2
  count = 0
  for path, text in rendered.items():
    count += len(block_names(text))
    if text != texts[path]:
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
  print(f"{count} blocks rendered into {len(rendered)} pages")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
