"""A profile or cut layers from the other framework, read onto this graph.

The same zoo model has the same layers in both frameworks, under two
spellings: torch names a nested module by its path ("features.4"), Keras
by a flat name ("features_4"). And each framework times layers the other
does not have apart: torch's functional ReLUs and the final float cast are
graph nodes of their own, where Keras fuses the ReLU into the convolution
before it and casts in an `activation` layer. So a profile of one side
names layers the other graph lacks, and lacks layer types the other graph
has; the cost model, which joins timings to layers by name, cannot take it
as it is.

`translate_profile` reads it onto this graph:

- names are matched as they are, else in their neutral spelling
  (`graph.neutral_layer_name`, the spelling burst plans use too);
- the time of a layer this graph lacks is added to the layer timed just
  before it at the same batch: a layer the other framework times apart
  (a ReLU, a cast) follows its producer, and here that time is inside
  the producer's layer (Keras' fused activation), so the stage that holds
  the producer pays it, as it does when the stages run;
- a layer of this graph whose type no timing covers gets zero time: it is
  the other half of the same fusion (torch's ReLU after a Keras-timed
  convolution whose timing already holds it; Keras' cast after torch's),
  and the cost model fits per layer type, so without a timing of its type
  it would have no fit at all. Every step's total is kept either way.

What cannot be carried over is refused: a layer with parameters that the
profile does not time under either spelling (the models differ, or name
their layers differently) holds time no neighbour can stand in for.

  profile = translate_profile(torch_profile, keras_graph)
  resolve_layer(keras_graph, "features.4")   # "features_4"
"""

import dataclasses
from typing import Dict, List

from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.graph import neutral_layer_name as neutral_name
from overlap_core.planning.profile import LayerTiming, Profile

def resolve_layer(graph: LayerGraph, name: str) -> str:
  """`graph`'s own name for layer `name` of either framework: the name
  itself when the graph has it, else the one layer whose neutral name is
  the same; `name` unchanged when there is none (the caller's refusal
  then names it)."""
  names = [n.name for n in graph.nodes]
  if name in names:
    return name
  matches = [n for n in names if neutral_name(n) == neutral_name(name)]
  return matches[0] if len(matches) == 1 else name


def translate_profile(profile: Profile, graph: LayerGraph) -> Profile:
  """`profile`, measured on the other framework's graph, onto `graph`'s
  layers (see the module docstring).

  Raises:
    ValueError: one line, for a profile that cannot serve the graph.
  """
  by_neutral = {neutral_name(n.name): n for n in graph.nodes}
  timings: List[LayerTiming] = []
  last_kept: Dict[int, int] = {}  # batch -> index in `timings`
  for t in profile.timings:
    node = by_neutral.get(neutral_name(t.layer))
    if node is not None:
      last_kept[t.batch_size] = len(timings)
      timings.append(dataclasses.replace(t, layer=node.name,
                                         op_type=node.op_type))
      continue
    k = last_kept.get(t.batch_size)
    if k is None:
      # Nothing timed before it (an input cast, say): nothing here runs
      # it either.
      continue
    before = timings[k]
    timings[k] = dataclasses.replace(
        before, forward_s=before.forward_s + t.forward_s,
        backward_s=before.backward_s + t.backward_s)
  timed = {t.layer for t in timings}
  for node in graph.nodes:
    if node.param_bytes and node.name not in timed:
      raise ValueError(
          f"a profile measured in {profile.framework} cannot serve graph "
          f"{graph.name!r}: it has no timing of layer {node.name!r} (or "
          f"{neutral_name(node.name)!r}), which holds parameters; the "
          "other framework's profile serves only a model whose layers "
          "with parameters have the same names (dots read as underscores)")
  timed_types = {t.op_type for t in timings}
  for node in graph.nodes:
    if node.name not in timed and node.op_type not in timed_types:
      timings += [LayerTiming(layer=node.name, op_type=node.op_type,
                              batch_size=b, forward_s=0.0, backward_s=0.0)
                  for b in profile.batch_sizes]
  updates = tuple(dataclasses.replace(u, layer=by_neutral[
      neutral_name(u.layer)].name) for u in profile.updates
                  if neutral_name(u.layer) in by_neutral)
  return dataclasses.replace(profile, model=graph.name,
                             timings=tuple(timings), updates=updates)
