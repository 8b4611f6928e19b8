"""What the commands say about their flags: short help, full help, and the
manual page behind each group and each refusal.

`--help` (and `--helpshort`, `-?`) shows the flags most runs set and says
where the rest are; `--helpfull` shows every flag, group by group, each
group ending with the page of the manual that explains it. A refused
setting names that page too (`page_for`). The pages are paths in the
source tree, as a checkout or the sdist has them.
"""

import sys
import textwrap
from typing import Optional

from absl import flags as absl_flags

from overlap_core.runtime.config import ConfigError

# The module that defines a group of flags -> the page that explains it.
GROUP_PAGES = {
    "flags.run": "docs/getting-started.md",
    "flags.model": "docs/your-own-model.md",
    "flags.data": "docs/overlaps/data.md",
    "flags.distribute": "docs/overlaps/strategies.md",
    "flags.checkpoint": "docs/overlaps/checkpoints.md",
    "flags.pipeline": "docs/overlaps/pipeline.md",
    "flags.offload": "docs/overlaps/offload.md",
    "flags.burst": "docs/overlaps/burst.md",
    "flags.plan": "docs/planning.md",
    "overlap_compare.cli": "docs/comparing.md",
}
REFERENCE_PAGE = "docs/reference/flags.md"
# What most runs set, in the order a newcomer meets them; `--help` shows
# these, and only those that the command defines.
COMMON_FLAGS = ("model", "dataset", "batch_size", "train_steps", "model_dir",
                "strategy", "num_devices", "num_workers", "prefetch",
                "checkpoint", "checkpoint_every", "pipeline_stages",
                "matrix", "frameworks", "repeats", "output_dir",
                "plan_output_dir")
SHORT_HELP_FLAGS = ("--help", "-help", "--helpshort", "-helpshort", "-?")
FULL_HELP_FLAGS = ("--helpfull", "-helpfull")

_WIDTH = 80


def page_for(error: ConfigError,
             flag_values: absl_flags.FlagValues = absl_flags.FLAGS
             ) -> Optional[str]:
  """The manual page that explains a refused setting, or None.

  A combination the compatibility table refuses points at the matrix; any
  other refusal at the page of the group that defines its flag.
  """
  if getattr(error, "page", None):
    return error.page
  if error.flag not in flag_values:
    return None
  return GROUP_PAGES.get(flag_values.find_module_defining_flag(error.flag))


def refusal_line(error: ConfigError,
                 flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> str:
  """The error's one line, ending with the page that explains it."""
  page = page_for(error, flag_values)
  return f"{error} (see {page})" if page else str(error)


def _render_flag(flag) -> str:
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  body = textwrap.fill(f"{name}: {flag.help}", _WIDTH,
                       initial_indent="  ", subsequent_indent="    ")
  return f"{body}\n    (default: {flag.default_as_str})"


def short_help(flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> str:
  """The main module's summary, the common flags, and where the rest are."""
  main = sys.modules.get("__main__")
  summary = (getattr(main, "__doc__", None) or "").strip()
  lines = [summary, ""] if summary else []
  common = [flag_values[n] for n in COMMON_FLAGS if n in flag_values]
  if common:
    lines.append("Common flags:")
    lines += [_render_flag(f) for f in common]
    lines.append("")
  lines.append(f"Every flag, by group: --helpfull, or {REFERENCE_PAGE}.")
  return "\n".join(lines)


def full_help(flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> str:
  """Every flag by defining module; each of this project's groups ends
  with the page that explains it, absl's own come last."""
  by_module = flag_values.flags_by_module_dict()
  ours = [m for m in GROUP_PAGES if m in by_module]
  others = sorted(m for m in by_module if m not in GROUP_PAGES)
  blocks = []
  for module in ours + others:
    flags = sorted(by_module[module], key=lambda f: f.name)
    block = [f"{module}:"] + [_render_flag(f) for f in flags]
    if module in GROUP_PAGES:
      block.append(f"  Explained in {GROUP_PAGES[module]}")
    blocks.append("\n".join(block))
  return "\n\n".join(blocks)


def asked_for(argv) -> Optional[str]:
  """"full", "short" or None: the help a command line asks for."""
  given = {a.split("=")[0] for a in argv[1:]}
  if given & set(FULL_HELP_FLAGS):
    return "full"
  if given & set(SHORT_HELP_FLAGS):
    return "short"
  return None
