"""The user-model overhead table: the trainers against plain loops on the
examples' own models (section 18).

Registered into `render_tables.TABLES` on import, like the tables there.
Every figure is read from `benchmarks/results/user_model_overhead.json`,
which `python -m benchmarks.user_model_overhead` writes, or, for the
PyTorch example with its sides in one process, from
`user_model_overhead_torch_one_process.json`, and for the Keras example
alone, from `user_model_overhead_keras_r31.json` and `_keras_r21.json`
(`RERUNS`); the comparisons within one run, in blocks, from
`fit_ledger_blocks.json` (Keras) and `loop_ledger_blocks.json` (PyTorch),
which `python -m benchmarks.fit_ledger_blocks` and
`python -m benchmarks.loop_ledger_blocks` write. Until a file exists its block says so and how to make it,
instead of failing the render.
"""

import functools

from benchmarks import fit_ledger_blocks
from benchmarks import harness
from benchmarks import loop_ledger_blocks
from benchmarks import user_model_overhead
from benchmarks.render_tables import (DASH, MissingResults, f3, g, load,
                                      markdown, table)

NOT_YET_RUN = (
    "Not yet run. `python -m benchmarks.user_model_overhead` writes "
    f"`benchmarks/results/{user_model_overhead.NAME}.json`; "
    "`python -m benchmarks.render` then fills this table.")


# Reruns kept apart from the full run's file, each rendered the same way:
# the suffix of its results file, and what it reran.
RERUNS = {
    "_torch_one_process": "the PyTorch example with every repeat of both "
                          "sides in one process (--sides_in=one_process)",
    "_keras_r31": "the Keras example alone at 31 repeats, its sides in one "
                  "process",
    "_keras_r21": "the Keras example alone at 21 repeats, on another host",
}


@table("user_model_overhead")
def user_model_overhead_table() -> str:
  return _overhead_tables(user_model_overhead.NAME)


def _sides_in(data: dict) -> str:
  """Where the sides ran: runs from before --sides_in ran each in a
  process of its own."""
  return data.get("sides_in", "processes").replace("_", " ")


def _host_caption(data: dict) -> str:
  """When and where a results file was measured, and whether the harness
  found the host busy."""
  busy = data.get("harness", {}).get("host_busy")
  load_at_start = data["machine"].get("load_average_at_start")
  return (f"{data['machine']['date']}, {data['machine']['cpu_count']} "
          "cores, load average at start "
          f"{f'{load_at_start[0]:.2f}' if load_at_start else DASH}; host "
          "busy (harness rules): "
          f"{DASH if busy is None else ('yes' if busy else 'no')}")


def _overhead_tables(results_name: str) -> str:
  try:
    data = load(results_name)
  except MissingResults:
    return NOT_YET_RUN
  rows = []
  for name, summary in data["summary"].items():
    config = data["configs"][name]
    for c in summary["comparisons"]:
      rows.append([
          f"`{name}`", config["framework"], g(config["train_steps"]),
          f"{c['side']} / {c['plain_side']}", c["measure"],
          g(c["plain_value"]), g(c["side_value"]),
          f3(c["time_ratio_of_medians"]), harness.format_interval(c["judged"]),
          harness.verdict(c["judged"], c["judged"]["target"],
                          c["judged"]["direction"])])
  caption = (f"Repeats: {data['repeats']}; {_host_caption(data)}; "
             f"sides run in: {_sides_in(data)}.")
  return caption + "\n\n" + markdown(
      ["example", "framework", "steps per run", "sides (trainer / plain)",
       "measured", "plain", "trainer", "time ratio of medians",
       "per-repeat ratio: median [interval] (coverage)", "target ≤ 1.02"],
      rows) + _gap_table(data)


def _gap_table(data: dict) -> str:
  """Where the PyTorch trainer's extra time per step goes
  (`torch_trainer_overhead.gap`); empty for results without it."""
  rows = []
  for name, summary in data["summary"].items():
    gap = summary.get("gap")
    if not gap:
      continue
    plain_ms = gap["plain_step_mean_ms"]

    def part(key, plain_ms=plain_ms, gap=gap):
      ms = gap[key]["median_ms"]
      return f"{ms:+.3f} ({100 * ms / plain_ms:+.1f}%)"

    rows.append([f"`{name}`", f3(plain_ms), part("step"), part("data_wait"),
                 part("bookkeeping"), part("step_work")])
  if not rows:
    return ""
  return ("\n\nWhere the trainer's extra time goes: mean step, trainer less "
          "plain, in ms (and % of the plain step), each the median over "
          "repeats of the paired difference; the parts add up per repeat, "
          "not across medians.\n\n" + markdown(
              ["example", "plain mean step ms", "trainer − plain",
               "wait for the batch", "trainer's bookkeeping (`other`)",
               "step's own work (the rest)"], rows))


def _blocks_table(name: str) -> str:
  """A blocks benchmark's table (`fit_ledger_blocks`, `loop_ledger_blocks`)."""
  try:
    data = load(name)
  except MissingResults:
    return (f"Not yet run. `python -m benchmarks.{name}` writes "
            f"`benchmarks/results/{name}.json`; "
            "`python -m benchmarks.render` then fills this table.")
  s = data["summary"]
  judged_ratio = s["judged"]
  ratios = judged_ratio["per_repeat"]
  caption = (f"Runs: {data['repeats']} of {data['steps_per_run']} steps "
             f"(the first {data['warmup_steps']} not counted), blocks of "
             f"{data['block_steps']}; {_host_caption(data)}.")
  return caption + "\n\n" + markdown(
      ["example", "off: mean step ms", "on: mean step ms", "on − off ms",
       "per-run ratios, lowest to highest",
       "per-run ratio: median [interval] (coverage)",
       f"target ≤ {data['target']:g}"],
      [[f"`{data['example']}`", f3(s["off_mean_ms_median"]),
        f3(s["on_mean_ms_median"]), f"{s['extra_ms_median']:+.3f}",
        f"{min(ratios):.3f} to {max(ratios):.3f}",
        harness.format_interval(judged_ratio),
        harness.verdict(judged_ratio, judged_ratio["target"],
                        judged_ratio["direction"])]])


for _name in (fit_ledger_blocks.NAME, loop_ledger_blocks.NAME):
  table(_name)(functools.partial(_blocks_table, _name))


for _suffix in RERUNS:
  _name = user_model_overhead.NAME + _suffix
  table(_name)(functools.partial(_overhead_tables, _name))
