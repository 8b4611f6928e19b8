"""The commands the docs show, parsed, and the flags each module defines.

A fenced block is runnable when the line before its opening fence is
`<!-- runnable -->`. Every `python -m MODULE ...` in such a block (also
after `srun`, `torchrun ... -m MODULE` and `horovodrun ... python -m`) is
one invocation; flags after a lone `--` belong to the trainer that the
launcher or the comparison runs.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from typing import Dict, FrozenSet, Iterable, List, NamedTuple, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
MARKER = "<!-- runnable -->"
# What runs the flags after `--`.
TRAINER_AFTER_DASHES = {
    "tfoverlap.launch": "tfoverlap.train",
    "torch_parity.launch": "torch_parity.train",
    # Both trainers define the same flags; the comparison checks its cells
    # against them.
    "overlap_compare": "tfoverlap.train",
}
# `python -m PACKAGE` runs PACKAGE.__main__; these define no flags
# themselves but import the module that does.
FLAG_MODULE = {"overlap_compare": "overlap_compare.cli"}
# Comparison flags whose values name trainer flags: axis := keys "=" ...
MATRIX_FLAGS = ("matrix", "workloads")
# Flags absl's parser handles itself, which no module defines.
PARSER_FLAGS = frozenset({"flagfile", "undefok"})


class Invocation(NamedTuple):
  module: str
  flags: Tuple[str, ...]  # flag names, without dashes or values
  values: Dict[str, str]  # the last value given for each flag


def runnable_blocks(text: str) -> List[Tuple[int, str]]:
  """(line number of the fence, code) of every runnable fenced block."""
  lines = text.split("\n")
  blocks = []
  for i, line in enumerate(lines):
    if line.strip() == MARKER:
      fence = lines[i + 1].strip() if i + 1 < len(lines) else ""
      if not fence.startswith("```"):
        raise ValueError(f"line {i + 1}: {MARKER} is not followed by a "
                         "fenced block")
      end = next(j for j in range(i + 2, len(lines))
                 if lines[j].strip() == "```")
      blocks.append((i + 2, "\n".join(lines[i + 2:end])))
  return blocks


_COMMAND_SEPARATORS = ("&&", "||", ";", "|")


def command_lines(code: str) -> List[List[str]]:
  """The shell words of each command of a block; comments dropped."""
  joined = re.sub(r"\\\n", " ", code)
  commands = []
  for line in joined.split("\n"):
    # `a && b` is two commands: b's flags are not a's.
    words = []
    for word in shlex.split(line, comments=True) + ["&&"]:
      if word in _COMMAND_SEPARATORS:
        if words:
          commands.append(words)
        words = []
      else:
        words.append(word)
  return commands


def _flag_names(words: Iterable[str]) -> List[str]:
  return [w[2:].split("=", 1)[0] for w in words
          if w.startswith("--") and len(w) > 2]


def _values(words: Iterable[str]) -> Dict[str, str]:
  return {w[2:].split("=", 1)[0]: w.split("=", 1)[1] for w in words
          if w.startswith("--") and "=" in w}


def invocations(words: List[str]) -> List[Invocation]:
  """The module invocations of one command (a launcher's trainer too)."""
  if "-m" not in words:
    return []
  at = words.index("-m")
  module, args = words[at + 1], words[at + 2:]
  own, trainer_args = args, []
  if "--" in args and module in TRAINER_AFTER_DASHES:
    cut = args.index("--")
    own, trainer_args = args[:cut], args[cut + 1:]
  found = [Invocation(module, tuple(_flag_names(own)), _values(own))]
  if trainer_args:
    trainer = TRAINER_AFTER_DASHES[module]
    found.append(Invocation(trainer, tuple(_flag_names(trainer_args)),
                            _values(trainer_args)))
  return found


def matrix_keys(spec: str) -> List[str]:
  """The trainer flags a comparison's --matrix or --workloads moves."""
  keys = []
  for axis in filter(None, spec.split(";")):
    keys += axis.split("=", 1)[0].split("+")
  return keys


def module_flags(modules: Iterable[str]) -> Dict[str, FrozenSet[str]]:
  """{module: the absl flags importing it defines}, each in a fresh process.

  The processes run side by side; each imports only the module (the trainers
  load no framework at import), so this takes about a second.
  """
  script = ("import importlib, json, sys\n"
            "from absl import flags\n"
            "importlib.import_module(sys.argv[1])\n"
            "print(json.dumps(sorted(flags.FLAGS)))\n")
  env = dict(os.environ, PYTHONPATH=ROOT)
  running = {
      m: subprocess.Popen([sys.executable, "-c", script, FLAG_MODULE.get(m, m)],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
      for m in sorted(set(modules))}
  found = {}
  for module, process in running.items():
    out, err = process.communicate(timeout=120)
    if process.returncode != 0:
      raise AssertionError(f"python -m {module}: cannot import: "
                           f"{err.strip().splitlines()[-1:]}")
    found[module] = frozenset(json.loads(out))
  return found


def unknown_flags(invocation: Invocation,
                  flags_of: Dict[str, FrozenSet[str]]) -> List[str]:
  """The flags of an invocation its module does not define."""
  known = flags_of[invocation.module] | PARSER_FLAGS
  bad = [f for f in invocation.flags
         if f not in known and not (f.startswith("no") and f[2:] in known)]
  if invocation.module in TRAINER_AFTER_DASHES:
    trainer = flags_of[TRAINER_AFTER_DASHES[invocation.module]]
    for name in MATRIX_FLAGS:
      if name in invocation.values:
        bad += [f"{name}: {k}" for k in matrix_keys(invocation.values[name])
                if k not in trainer]
  return bad
