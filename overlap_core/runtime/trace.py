"""Chrome-trace / Perfetto JSON of a ledger's spans, framework-neutral.

Open the file at ui.perfetto.dev or chrome://tracing: one row per worker, each
step a slice with its phases nested inside.
"""

import json
import os
from typing import Iterable

from overlap_core.runtime.ledger import Span
from overlap_core.runtime.run_record import write_json_atomically


def trace_events(spans: Iterable[Span], *, origin_s: float, pid: int,
                 process_name: str) -> list:
  """Complete ("X") events in microseconds since `origin_s`."""
  events = [{
      "name": "process_name",
      "ph": "M",
      "pid": pid,
      "tid": 0,
      "args": {"name": process_name},
  }]
  # Parents before children at equal start times, so viewers nest correctly.
  ordered = sorted(spans, key=lambda s: (s.start_s, -(s.end_s - s.start_s)))
  for span in ordered:
    events.append({
        "name": span.name,
        "cat": "step" if span.name == "step" else "phase",
        "ph": "X",
        "ts": round((span.start_s - origin_s) * 1e6, 3),
        "dur": round(span.duration_s * 1e6, 3),
        "pid": pid,
        "tid": 0,
        "args": {"step": span.step},
    })
  return events


def write_chrome_trace(path: str, spans: Iterable[Span], *, origin_s: float,
                       pid: int = 0, process_name: str = "worker 0") -> str:
  """Writes the spans as a Chrome-trace JSON file; returns its path."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  write_json_atomically(path, {
      "traceEvents": trace_events(spans, origin_s=origin_s, pid=pid,
                                  process_name=process_name),
      "displayTimeUnit": "ms",
  })
  return path


def load_trace(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)
