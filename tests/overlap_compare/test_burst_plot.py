"""The scaling plot of a burst plan: each layer's time against its width."""

from PIL import Image

from overlap_compare import burst_plot
from overlap_core.planning import burst
from overlap_core.planning.graph import chain
from overlap_core.planning.profile import LayerTiming, Profile


def _plan():
  graph = chain("tiny", [(f"l{i}", "linear", {}) for i in range(4)],
                batch_size=8)
  timings = [LayerTiming(f"l{i}", "linear", b, (i + 1) * 1e-3 + 1e-4 * b,
                         0.0) for i in range(4) for b in (2, 4, 8)]
  profile = Profile(model="tiny", framework="synthetic", device="none",
                    warmup=0, repeats=1, timings=tuple(timings))
  return burst.plan_burst(graph, profile, global_batch=8, num_devices=4,
                          amplification_limit=1.5)


def test_the_plot_draws_one_curve_per_layer(tmp_path):
  plan = _plan()
  path = burst_plot.write_scaling_plot(plan, str(tmp_path / "s.png"))
  with Image.open(path) as image:
    assert image.size[0] > 300 and image.size[1] > 200
    pixels = list(image.convert("RGB").getdata())
  # The first labelled curve is drawn in matplotlib's first colour
  # (C0, #1f77b4); a figure without curves has no pixel of it.
  c0 = sum(1 for p in pixels if abs(p[0] - 31) + abs(p[1] - 119)
           + abs(p[2] - 180) < 30)
  assert c0 > 100


def test_the_command_refuses_a_file_that_is_no_plan(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text("{}")
  assert burst_plot.main(["burst_plot", str(bad),
                          str(tmp_path / "x.png")]) == 2
  good = tmp_path / "plan.json"
  good.write_text(_plan().to_json())
  assert burst_plot.main(["burst_plot", str(good),
                          str(tmp_path / "y.png")]) == 0
  assert (tmp_path / "y.png").exists()
