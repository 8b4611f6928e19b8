"""Bounded waits: the one collective timeout, and how a timed-out run ends.

Both frameworks give every collective the same limit, so a peer that stops
answering (hung, stuck in its input, or on a lost host) ends the job with
an error instead of leaving it waiting forever. Framework-neutral: an error
is recognized by its message, never by importing a framework.

  timeout = describe_timeout(error)  # None, or what timed out, after how long
  print(explain(error))              # "timed out after 180 s waiting for a peer (...)"
"""

import os
import re
from typing import Optional

from overlap_core.runtime.config import ConfigError

# A collective that waits this long for a peer fails instead of hanging the
# job. A launcher notices a dead peer much sooner (it watches its processes);
# this bounds what it cannot see: a peer alive but stuck, or on another host.
COLLECTIVE_TIMEOUT_S = 180
# Overrides COLLECTIVE_TIMEOUT_S: for tests, and for jobs whose peers are
# legitimately apart longer (a slow step or save on a large model).
COLLECTIVE_TIMEOUT_ENV = "TFOVERLAP_COLLECTIVE_TIMEOUT_S"
COLLECTIVE_TIMEOUT = "collective_timeout"

# What each framework says when a collective gives up on a peer.
_PEER_TIMEOUT = re.compile("|".join([
    # TensorFlow: CommunicationOptions.timeout_seconds passed
    # (DeadlineExceededError).
    r"Collective has timed out",
    # gloo, under DDP and under Horovod.
    r"Timed out waiting \d+ ?ms for (?:recv|send)",
    # torch's rendezvous store: a rank that never joined.
    r"Timed out after \d+ seconds waiting for clients",
    # NCCL's watchdog (GPUs).
    r"collective operation timeout",
]), re.IGNORECASE)


class TimeoutSettingError(ConfigError):
  """A collective timeout in the environment that is not a whole number."""

  def __init__(self, raw: str):
    super().__init__(COLLECTIVE_TIMEOUT_ENV, raw,
                     "allowed: a whole number of seconds >= 1")
    # Not a flag: the message names the environment variable as it is set.
    self.args = (f"{COLLECTIVE_TIMEOUT_ENV}={raw}: allowed: a whole number "
                 "of seconds >= 1",)


def collective_timeout_s() -> int:
  """The collective timeout in whole seconds: the environment's, or 180.

  Raises:
    TimeoutSettingError: a ConfigError (the trainers exit 2 with its one
      line) when the environment variable is set but not an integer >= 1.
  """
  raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
  if not raw:
    return COLLECTIVE_TIMEOUT_S
  try:
    value = int(raw)
  except ValueError:
    value = 0
  if value < 1:
    raise TimeoutSettingError(raw)
  return value


def timeout_line(timeout: dict) -> str:
  """The words a user reads: what timed out, after how long."""
  return f"timed out after {timeout['timeout_s']:g} s waiting for a peer"


def describe_timeout(error: BaseException) -> Optional[dict]:
  """What run.json records about `error` if a collective timed out.

  Args:
    error: what ended the run.

  Returns:
    {"kind": "collective_timeout", "timeout_s": N, "error": <its type>,
    "message": <the line of its message that says so>}, or None when
    `error` is anything else.
  """
  text = str(error)
  match = _PEER_TIMEOUT.search(text)
  if match is None:
    return None
  start = text.rfind("\n", 0, match.start()) + 1
  end = text.find("\n", match.end())
  line = text[start:] if end < 0 else text[start:end]
  return {"kind": COLLECTIVE_TIMEOUT, "timeout_s": collective_timeout_s(),
          "error": type(error).__name__, "message": line.strip()}


class CollectiveTimeoutError(TimeoutError):
  """A collective gave up on a peer; the message says so in one line."""


def explain(error: BaseException) -> BaseException:
  """`error`, or for a collective timeout one that says so in its first line.

  The trainers print the first line of the error that ended the run, and a
  framework's own first line does not say that a peer stopped answering
  (TensorFlow's is "Graph execution error:").
  """
  timeout = describe_timeout(error)
  if timeout is None:
    return error
  explained = CollectiveTimeoutError(
      f"{timeout_line(timeout)} ({timeout['error']}: {timeout['message']})")
  explained.__cause__ = error
  return explained
