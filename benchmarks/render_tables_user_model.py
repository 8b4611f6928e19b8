"""The user-model overhead table: the trainers against plain loops on the
examples' own models (section 18).

Registered into `render_tables.TABLES` on import, like the tables there.
Every figure is read from `benchmarks/results/user_model_overhead.json`,
which `python -m benchmarks.user_model_overhead` writes, or, for the
PyTorch example with its sides in one process, from
`user_model_overhead_torch_one_process.json`, and for the Keras example
alone, from `user_model_overhead_keras_r31.json` and `_keras_r21.json`
(`RERUNS`). Until a file exists its block says so and how to make it,
instead of failing the render.
"""

import functools

from benchmarks import harness
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
  busy = data.get("harness", {}).get("host_busy")
  load_at_start = data["machine"].get("load_average_at_start")
  caption = (f"Repeats: {data['repeats']}; {data['machine']['date']}, "
             f"{data['machine']['cpu_count']} cores, load average at start "
             f"{f'{load_at_start[0]:.2f}' if load_at_start else DASH}; host "
             f"busy (harness rules): "
             f"{DASH if busy is None else ('yes' if busy else 'no')}; "
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


for _suffix in RERUNS:
  _name = user_model_overhead.NAME + _suffix
  table(_name)(functools.partial(_overhead_tables, _name))
