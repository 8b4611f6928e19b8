"""The comparison matrix: which trainer flags vary, and the cells they make.

A spec names axes separated by `;`. Each axis is one trainer flag (or
several that move together, joined by `+`) and its settings, separated by
`,`:

  prefetch=0,2;checkpoint=sync,async;strategy=default,mirrored
  checkpoint+checkpoint_every=sync+20,async+20,async+auto

Grammar (whitespace around tokens is ignored):

  spec    := axis { ";" axis }
  axis    := keys "=" setting { "," setting }
  keys    := flag { "+" flag }        trainer flag names, without dashes
  setting := value { "+" value }      one value per key, in the same order

The first setting of every axis is its baseline: the optimization off. The
matrix is the cross product of the axes, and a cell's "optimizations" are
the axes it moves off their baseline, so the all-baseline cell is the serial
reference, a cell with one axis moved is a single optimization, and the rest
are combinations. Values are passed to the trainer verbatim (`--flag=value`)
and so may not contain `;`, `,`, `=` or `+`.

  axes = parse_axes("prefetch=0,2;checkpoint=sync,async")
  matrix = Matrix(axes)
  for cell in matrix.cells():
    matrix.label(cell), matrix.flag_args(cell)
"""

import dataclasses
import difflib
import itertools
import re
from typing import Iterable, List, Sequence, Tuple

BASELINE_LABEL = "baseline"
# Flags a spec may not vary: the comparison sets each run's model_dir itself,
# and a flagfile would hide which flags a cell really changed.
RESERVED_FLAGS = ("model_dir", "flagfile")
_FLAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class MatrixSpecError(ValueError):
  """A spec that cannot be parsed or names flags that do not exist."""


@dataclasses.dataclass(frozen=True)
class Axis:
  """One dimension of the matrix: flags and the settings they take together.

  Attributes:
    keys: the trainer flags this axis sets, e.g. ("checkpoint",).
    settings: one tuple of values (aligned with `keys`) per setting; the
      first is the baseline.
  """
  keys: Tuple[str, ...]
  settings: Tuple[Tuple[str, ...], ...]

  @property
  def name(self) -> str:
    return "+".join(self.keys)

  def describe(self, index: int) -> str:
    """`flag=value` (or `a+b=x+y`) for setting `index`."""
    return f"{self.name}={'+'.join(self.settings[index])}"

  def flag_args(self, index: int) -> List[str]:
    return [f"--{k}={v}" for k, v in zip(self.keys, self.settings[index])]


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
  """One point of a matrix: the setting index chosen on every axis."""
  choices: Tuple[int, ...]

  @property
  def optimizations(self) -> Tuple[int, ...]:
    """Indices of the axes this cell moves off their baseline."""
    return tuple(i for i, c in enumerate(self.choices) if c)

  @property
  def is_baseline(self) -> bool:
    return not self.optimizations

  def without(self, axis_index: int) -> "Cell":
    """This cell with one axis put back on its baseline."""
    choices = list(self.choices)
    choices[axis_index] = 0
    return Cell(tuple(choices))


class Matrix:
  """The cross product of axes, baseline cell first.

  Args:
    axes: parsed axes; an empty sequence gives one cell with no flags (a
      workload grid with nothing varied).
  """

  def __init__(self, axes: Sequence[Axis]):
    self._axes = tuple(axes)

  @property
  def axes(self) -> Tuple[Axis, ...]:
    return self._axes

  def cells(self) -> List[Cell]:
    ranges = [range(len(a.settings)) for a in self._axes]
    # itertools.product varies the last axis fastest and starts at all zeros,
    # so the baseline comes first and single optimizations come early.
    return [Cell(tuple(c)) for c in itertools.product(*ranges)]

  def label(self, cell: Cell) -> str:
    """`baseline`, or the moved axes: `prefetch=2 + checkpoint=async`."""
    if cell.is_baseline:
      return BASELINE_LABEL
    return " + ".join(self._axes[i].describe(cell.choices[i])
                      for i in cell.optimizations)

  def full_label(self, cell: Cell) -> str:
    """Every axis, baseline ones included: `prefetch=0, checkpoint=async`."""
    return ", ".join(a.describe(c) for a, c in zip(self._axes, cell.choices))

  def flag_args(self, cell: Cell) -> List[str]:
    args = []
    for axis, choice in zip(self._axes, cell.choices):
      args += axis.flag_args(choice)
    return args

  def slug(self, cell: Cell) -> str:
    """A directory name for the cell, readable and filesystem-safe."""
    if not self._axes:
      return "all"
    parts = [f"{a.name}-{'+'.join(a.settings[c])}"
             for a, c in zip(self._axes, cell.choices)]
    return _SLUG_UNSAFE.sub("_", "_".join(parts))

  def flag_names(self) -> List[str]:
    return [k for a in self._axes for k in a.keys]


def parse_axes(spec: str, *, min_settings: int = 2,
               what: str = "--matrix") -> List[Axis]:
  """Parses a spec into axes, checking its form but not the flag names.

  Args:
    spec: the text, e.g. "prefetch=0,2;checkpoint=sync,async".
    min_settings: settings each axis needs (2 for optimizations: a baseline
      and at least one alternative; 1 for workload conditions).
    what: the flag the spec came from, for error messages.

  Returns:
    The axes in spec order; [] for an empty spec when min_settings allows.

  Raises:
    MatrixSpecError: naming the part of the spec that is wrong.
  """
  if not spec.strip():
    if min_settings > 1:
      raise MatrixSpecError(f"{what} is empty; allowed: axes like "
                            "'prefetch=0,2;checkpoint=sync,async'")
    return []
  axes = []
  seen = {}
  for text in spec.split(";"):
    axis = _parse_axis(text.strip(), min_settings=min_settings, what=what)
    for key in axis.keys:
      if key in seen:
        raise MatrixSpecError(f"{what}: flag {key!r} appears in two axes "
                              f"({seen[key]!r} and {text.strip()!r}); "
                              "allowed: each flag on one axis")
      seen[key] = text.strip()
    axes.append(axis)
  return axes


def _parse_axis(text: str, *, min_settings: int, what: str) -> Axis:
  if not text:
    raise MatrixSpecError(f"{what}: empty axis (two ';' in a row or a "
                          "trailing ';')")
  if text.count("=") != 1:
    raise MatrixSpecError(f"{what}: axis {text!r} needs exactly one '=' "
                          "between flag names and settings, e.g. "
                          "'prefetch=0,2'")
  keys_text, settings_text = (part.strip() for part in text.split("="))
  keys = tuple(k.strip().lstrip("-") for k in keys_text.split("+"))
  for key in keys:
    if not _FLAG_NAME.match(key):
      raise MatrixSpecError(f"{what}: axis {text!r}: {key!r} is not a flag "
                            "name")
  if len(set(keys)) != len(keys):
    raise MatrixSpecError(f"{what}: axis {text!r} names a flag twice")
  settings = []
  for setting_text in settings_text.split(","):
    values = tuple(v.strip() for v in setting_text.split("+"))
    if len(values) != len(keys):
      raise MatrixSpecError(
          f"{what}: axis {text!r}: setting {setting_text.strip()!r} has "
          f"{len(values)} value(s) for {len(keys)} flag(s) {keys_text!r}; "
          "join one value per flag with '+'")
    if any(not v for v in values):
      raise MatrixSpecError(f"{what}: axis {text!r} has an empty value")
    if values in settings:
      raise MatrixSpecError(f"{what}: axis {text!r} repeats setting "
                            f"{'+'.join(values)!r}")
    settings.append(values)
  if len(settings) < min_settings:
    raise MatrixSpecError(
        f"{what}: axis {text!r} has {len(settings)} setting(s); allowed: at "
        f"least {min_settings} (the first is the baseline). Pass a flag "
        "that never varies after '--' instead")
  return Axis(keys, tuple(settings))


def check_flag_names(axes: Iterable[Axis], known: Iterable[str], *,
                     what: str = "--matrix") -> None:
  """Refuses flags the trainers do not define, and those a spec may not set.

  Raises:
    MatrixSpecError: naming the flag and, for a likely typo, the closest
      real one.
  """
  known = set(known)
  for axis in axes:
    for key in axis.keys:
      if key in RESERVED_FLAGS:
        raise MatrixSpecError(f"{what}: flag {key!r} cannot vary; the "
                              "comparison sets it for every run")
      if key not in known:
        hint = _closest(key, known)
        raise MatrixSpecError(
            f"{what}: {key!r} is not a trainer flag"
            + (f"; did you mean {hint!r}?" if hint else "") +
            " (python -m tfoverlap.train --helpfull lists them)")


def _closest(name: str, known: Iterable[str]) -> str:
  matches = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.7)
  return matches[0] if matches else ""
