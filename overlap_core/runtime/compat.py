"""What combines with what: one check and one matrix from `compat_table`.

Both trainers' `check_supported` (and so their launchers) call
`check_combinations` (their entry points call `check_without_host` before
the framework is imported); the planning commands call it for the rows about
what they plan. No other code refuses a combination of features. The docs'
page "What combines with what" (docs/compatibility.md) is `render_matrix()`:

  python -m overlap_core.runtime.compat

Usage:
  check_combinations(config, "pytorch", host=Host(num_gpus=0))
"""

import dataclasses
import os
from typing import Callable, Iterable, List, Optional, Sequence

from overlap_core.runtime.compat_table import (BOTH, EXCLUSIVE, FEATURES,
                                               FLAG_VALUES, PLANNED_FEATURES,
                                               PT, ROWS, TF, Host, Row)
from overlap_core.runtime.config import (ConfigError, TrainConfig,
                                         check_burst_supported)

FRAMEWORK_NAMES = {TF: "TensorFlow", PT: "PyTorch"}
# The manual page that holds render_matrix(); every refusal names it.
DOCS_PAGE = "docs/compatibility.md"


def row_features(row: Row) -> List[tuple]:
  """The row's slots, each a tuple of alternatives."""
  return [s if isinstance(s, tuple) else (s,) for s in row.features]


def _holds(name: str, config: TrainConfig, host: Optional[Host]) -> bool:
  return FEATURES[name].holds(config, host)


def _row_matches(row: Row, config: TrainConfig,
                 host: Optional[Host]) -> bool:
  return all(any(_holds(n, config, host) for n in slot)
             for slot in row_features(row))


def matching_rows(config: TrainConfig, framework: str, *,
                  host: Optional[Host] = None,
                  only: Optional[Iterable[str]] = None) -> List[Row]:
  """The rows of `framework` that refuse `config`, in table order.

  Args:
    config: the validated run configuration.
    framework: "tensorflow" or "pytorch".
    host: this host; None skips the rows that name a host feature.
    only: check only the rows whose features are all in this set.
  """
  if framework not in BOTH:
    raise ValueError(f"framework={framework!r}: allowed: {', '.join(BOTH)}")
  allowed = set(only) if only is not None else None
  found = []
  for row in ROWS:
    names = {n for slot in row_features(row) for n in slot}
    if framework not in row.frameworks:
      continue
    if allowed is not None and not names <= allowed:
      continue
    if host is None and any(FEATURES[n].host for n in names):
      continue
    if _row_matches(row, config, host):
      found.append(row)
  return found


def refusal(row: Row, config: TrainConfig) -> ConfigError:
  """The one-line error a row gives for `config`."""
  fields = {"strategy": config.distribute.strategy}
  given = f" {row.given.format(**fields)}" if row.given else ""
  return ConfigError(row.flag, FLAG_VALUES[row.flag](config),
                     f"{row.reason.format(**fields)}; "
                     f"allowed{given}: {row.allowed.format(**fields)}",
                     page=DOCS_PAGE)


def check_combinations(config: TrainConfig, framework: str, *,
                       host: Optional[Host] = None,
                       only: Optional[Iterable[str]] = None) -> None:
  """Refuses the first combination the table says `framework` cannot run.

  Raises:
    ConfigError: "--flag=value: reason; allowed ...: alternative".
  """
  rows = matching_rows(config, framework, host=host, only=only)
  if rows:
    raise refusal(rows[0], config)


def check_without_host(config: TrainConfig, framework: str) -> None:
  """`check_combinations` as far as it goes before the host is known: the
  entry points call it before the framework is imported, so a refusal the
  host cannot change answers at once. It refuses only where the trainer's
  `check_supported` would give the same line on any host: it stops, saying
  nothing, at the first row that may refuse `config` and names a host
  feature (the trainer checks that row and the rest).

  Raises:
    ConfigError: the first row's line, as `check_supported` has it.
  """
  def may_hold(name: str) -> bool:
    feature = FEATURES[name]
    return feature.host is not None or feature.holds(config, None)

  for row in ROWS:
    if framework not in row.frameworks:
      continue
    slots = row_features(row)
    if not all(any(may_hold(n) for n in slot) for slot in slots):
      continue
    if any(FEATURES[n].host is not None for slot in slots for n in slot):
      return
    raise refusal(row, config)


def check_supported(config: TrainConfig, framework: str, *, num_gpus: int,
                    side_checks: Sequence[Callable[[TrainConfig], None]]
                    ) -> None:
  """What every trainer refuses before it starts, in one order: the table's
  combinations first (they say why a feature cannot be had at all), then
  the counts the framework's runtime must match (`side_checks`), then the
  burst plan's devices against this host's.

  Args:
    config: the validated run configuration.
    framework: "tensorflow" or "pytorch".
    num_gpus: GPUs on this host.
    side_checks: the framework's own checks of counts, in order.

  Raises:
    ConfigError: naming the flag, the value and why.
  """
  check_combinations(config, framework, host=Host(num_gpus=num_gpus))
  for check in side_checks:
    check(config)
  check_burst_supported(
      config.burst, host_devices=num_gpus or os.cpu_count(),
      device_kind="GPUs" if num_gpus else "CPU cores")


def check_planned(config: TrainConfig, framework: str, *,
                  burst: bool = False) -> None:
  """`check_combinations` for a planning command: only the rows about the
  plan it makes (the trainer checks the rest when it runs).

  Args:
    config: the run the plan is for.
    framework: the trainer that will run it.
    burst: the plan is a burst plan, so the run will have one: every row
      with `burst` applies, as if --burst_parallel were set.
  """
  if not burst:
    check_combinations(config, framework, only=PLANNED_FEATURES)
    return
  planned = dataclasses.replace(
      config, burst=dataclasses.replace(config.burst,
                                        plan_path="<the plan>"))
  for row in matching_rows(planned, framework):
    if any("burst" in slot for slot in row_features(row)):
      raise refusal(row, planned)


def exclusive(a: str, b: str) -> bool:
  """Whether a and b are two values of one flag (or host), never together."""
  return a != b and any(a in group and b in group for group in EXCLUSIVE)


def _met_by(row: Row, names) -> bool:
  return all(any(n in slot for n in names) for slot in row_features(row))


def refused_pair(a: str, b: str, framework: str) -> List[int]:
  """Indexes of the rows of `framework` that refuse a and b together and
  that neither refuses alone (a == b: the rows that refuse it alone)."""
  return [i for i, row in enumerate(ROWS)
          if framework in row.frameworks and _met_by(row, {a, b}) and
          (a == b or not (_met_by(row, {a}) or _met_by(row, {b})))]


def _needs_more(a: str, b: str, framework: str) -> List[int]:
  """Rows of three features or more that a and b take part in."""
  return [i for i, row in enumerate(ROWS)
          if framework in row.frameworks and len(row.features) > 2 and a != b
          and sum(a in s or b in s for s in row_features(row)) >= 2]


def _footnote_text(row: Row) -> str:
  fields = {"strategy": "X"}  # a placeholder the message fills in
  names = " + ".join("|".join(slot) for slot in row_features(row))
  sides = " and ".join(FRAMEWORK_NAMES[f] for f in row.frameworks)
  given = f" {row.given.format(**fields)}" if row.given else ""
  return (f"{names} ({sides}, --{row.flag}): {row.reason.format(**fields)}"
          f"; allowed{given}: {row.allowed.format(**fields)}")


def render_matrix() -> str:
  """The feature-by-feature matrix in Markdown, with a footnote per row.

  A cell is "yes" where no row refuses the two features together, and
  "TF no[1]" / "PT no[1]" / "no[1]" (both) where one does; "-" pairs two
  values of one flag. The diagonal holds what a framework lacks on its
  own; a pair with a feature refused alone is read there. Rows of three
  features mark their pairs "if", the footnote saying what else must hold.
  """
  names = list(FEATURES)
  notes = {}

  def note(index: int) -> str:
    notes.setdefault(index, len(notes) + 1)
    return f"[{notes[index]}]"

  def cell(a: str, b: str) -> str:
    if exclusive(a, b):
      return "-"
    parts = []
    for framework, short in ((TF, "TF"), (PT, "PT")):
      rows = refused_pair(a, b, framework)
      if rows:
        parts.append((short, "no", rows[0]))
        continue
      wider = _needs_more(a, b, framework)
      if wider:
        parts.append((short, "if", wider[0]))
    if not parts:
      return "yes"
    if (len(parts) == 2 and parts[0][1:] == parts[1][1:]):
      return f"{parts[0][1]}{note(parts[0][2])}"
    return " ".join(f"{s} {w}{note(i)}" for s, w, i in parts)

  lines = ["| | " + " | ".join(f"`{n}`" for n in names) + " |",
           "|---" * (len(names) + 1) + "|"]
  for a in names:
    lines.append(f"| `{a}` | " +
                 " | ".join(cell(a, b) for b in names) + " |")
  lines.append("")
  for index, number in sorted(notes.items(), key=lambda kv: kv[1]):
    lines.append(f"{number}. {_footnote_text(ROWS[index])}")
  return "\n".join(lines) + "\n"


def main() -> int:
  print(render_matrix(), end="")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
