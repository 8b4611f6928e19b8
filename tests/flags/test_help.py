"""What the commands say about their flags: short and full help, and the
manual page each group and each refusal names."""

import os

from absl.testing import flagsaver

import flags as tfo_flags
from flags import help as flag_help
from overlap_core.runtime import compat
from overlap_core.runtime.config import ConfigError

from tests.helpers import REPO_ROOT, run_module

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()


def test_every_named_page_exists():
  for page in list(flag_help.GROUP_PAGES.values()) + [
      flag_help.REFERENCE_PAGE, compat.DOCS_PAGE]:
    assert os.path.isfile(os.path.join(REPO_ROOT, page)), page


def test_short_help_shows_the_common_flags_and_where_the_rest_are():
  result = run_module("tfoverlap.train", "--help", timeout=120)
  assert result.returncode == 0, result.stderr
  assert "--batch_size:" in result.stdout and "--strategy:" in result.stdout
  assert "--offload:" not in result.stdout  # not a common flag
  assert result.stdout.rstrip().endswith(
      f"Every flag, by group: --helpfull, or {flag_help.REFERENCE_PAGE}.")


def test_full_help_ends_each_group_with_its_page():
  text = flag_help.full_help(tfo_flags.FLAGS)
  for group in tfo_flags.GROUPS.values():
    block = text.split(f"\n{group.__name__}:\n", 1)[-1].split("\n\n")[0]
    assert block.splitlines()[-1] == (
        f"  Explained in {flag_help.GROUP_PAGES[group.__name__]}"), block


def test_a_refusal_names_its_groups_page():
  error = ConfigError("checkpoint_keep", 0, "allowed: 1 or more")
  assert flag_help.refusal_line(error, tfo_flags.FLAGS) == (
      "--checkpoint_keep=0: allowed: 1 or more "
      "(see docs/overlaps/checkpoints.md)")


def test_a_refused_combination_names_the_matrix(tmp_path):
  with flagsaver.as_parsed(loop="fit", model_dir=str(tmp_path)):
    config = tfo_flags.to_config()
  try:
    compat.check_combinations(config, compat.PT)
  except ConfigError as error:
    line = flag_help.refusal_line(error, tfo_flags.FLAGS)
  else:
    raise AssertionError("PyTorch accepted --loop=fit")
  assert line.startswith("--loop=fit: ")
  assert line.endswith(f"(see {compat.DOCS_PAGE})")


def test_the_trainer_prints_the_page_on_a_refusal():
  result = run_module("torch_parity.train", "--loop=fit", timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().endswith(f"(see {compat.DOCS_PAGE})")
