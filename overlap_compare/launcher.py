"""A launcher command template: how a comparison starts each run elsewhere.

By default every run is a local process (`trainer_runs.build_command`). On
a cluster, each run must go through the scheduler or a multi-host launcher,
which then starts one trainer per task:

  --launcher='srun -N2 --ntasks-per-node=1 {command}'
  --launcher='torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d
              --rdzv_endpoint=node01:29400 -m {module} {flags}'

The template is split like a shell line (quotes group words). A word that
is exactly `{command}` becomes the whole trainer command line
(`python -m <train module> <flags>`), and `{flags}` the trainer flags
alone; other placeholders may sit inside a word: `{python}`, `{module}`,
`{framework}`, `{model_dir}`. The trainers read their cluster from what the
launcher sets (TF_CONFIG, Slurm's variables, torchrun's), so the flags of a
multi-host cell are the same as on one host.

  template = LauncherTemplate.parse("srun -N2 {command}")
  template.expand(python="python3", module="tfoverlap.train",
                  framework="tensorflow", flags=["--model=mlp"],
                  model_dir="out/r0")
  -> ["srun", "-N2", "python3", "-m", "tfoverlap.train", "--model=mlp"]
"""

import dataclasses
import shlex
import string
from typing import List, Sequence, Tuple

LIST_PLACEHOLDERS = ("command", "flags")
WORD_PLACEHOLDERS = ("python", "module", "framework", "model_dir")
_ALLOWED = ("{command} or {flags} as whole words; {python}, {module}, "
            "{framework}, {model_dir} anywhere")


def _invalid(template: str, why: str) -> ValueError:
  return ValueError(f"Invalid value for argument `launcher`. Received: "
                    f"{template!r}: {why}; allowed: {_ALLOWED}")


def _placeholders(word: str, template: str) -> List[str]:
  """The placeholder names in one word of the template."""
  try:
    parsed = list(string.Formatter().parse(word))
  except ValueError as e:
    raise _invalid(template, f"{e} in {word!r}") from None
  names = []
  for _, name, spec, conversion in parsed:
    if name is None:
      continue
    if spec or conversion or not name:
      raise _invalid(template, f"{word!r} formats a placeholder")
    names.append(name)
  return names


@dataclasses.dataclass(frozen=True)
class LauncherTemplate:
  """A validated launcher template, as words."""
  words: Tuple[str, ...]

  @classmethod
  def parse(cls, template: str) -> "LauncherTemplate":
    """Splits and checks `template`.

    Raises:
      ValueError: one line naming the template and what is wrong
        (unbalanced quotes, an unknown placeholder, no place for the
        trainer's flags).
    """
    try:
      words = shlex.split(template)
    except ValueError as e:
      raise _invalid(template, str(e)) from None
    found = set()
    for word in words:
      names = _placeholders(word, template)
      for name in names:
        if name not in LIST_PLACEHOLDERS + WORD_PLACEHOLDERS:
          raise _invalid(template, f"unknown placeholder {{{name}}}")
        if name in LIST_PLACEHOLDERS and word != f"{{{name}}}":
          raise _invalid(template, f"{{{name}}} must be a word of its own")
      found.update(names)
    if not found & set(LIST_PLACEHOLDERS):
      raise _invalid(template, "it has neither {command} nor {flags}, so "
                     "the trainer's flags would go nowhere")
    return cls(words=tuple(words))

  def expand(self, *, python: str, module: str, framework: str,
             flags: Sequence[str], model_dir: str) -> List[str]:
    """The argv of one run."""
    scalars = {"python": python, "module": module, "framework": framework,
               "model_dir": model_dir}
    lists = {"command": [python, "-m", module, *flags], "flags": list(flags)}
    argv = []
    for word in self.words:
      if word.startswith("{") and word.endswith("}") and word[1:-1] in lists:
        argv += lists[word[1:-1]]
      else:
        argv.append(word.format(**scalars))
    return argv
