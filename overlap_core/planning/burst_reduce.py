"""Exact minimum of an additive per-layer width choice, by graph reduction.

The burst planner's objective on a layer graph is

  sum over layers of  node_cost(layer, k_layer)
  + sum over edges of edge_cost(producer, consumer, k_producer, k_consumer)

which a series-parallel graph minimizes exactly by reduction, as DeepPool
does: every edge u -> v holds a table M[k_u][k_v], the least cost of
everything strictly between u and v given their widths.

  series    a layer w with one producer edge u -> w and one consumer edge
            w -> v collapses into u -> v with
            M[k_u][k_v] = min over k_w of M1[k_u][k_w] + node(w, k_w)
                                           + M2[k_w][k_v]
  parallel  two edges u -> v (a ResNet skip beside its block, the branches
            of an Inception block once each is collapsed) add their tables.

At the end one edge joins the model input to the output layer. The choice
of every collapsed layer is read back from the recorded argmins. A graph
that does not reduce (not series-parallel) is refused with one line naming
a layer left over. Ties go to the narrower width: fewer device-seconds.
"""

import math
from typing import Callable, Dict, List, Sequence, Tuple

INF = math.inf
SINK = "__sink__"  # joins several output layers into one terminal


def solve(layers: Sequence[str], edges: Sequence[Tuple[str, str]],
          source: str, allowed: Callable[[str], Sequence[int]],
          widths: Sequence[int],
          node_cost: Callable[[str, int], float],
          edge_cost: Callable[[str, str, int, int], float]
          ) -> Tuple[Dict[str, int], float]:
  """The width per layer minimizing the objective, and its value.

  Args:
    layers: node names in topological order (the source excluded).
    edges: (producer, consumer) pairs, each once; producers include source.
    source: the model input; its width is free and it costs nothing.
    allowed: the widths a layer may take (a subset of `widths`).
    widths: every candidate width, increasing.
    node_cost, edge_cost: the objective's terms, in seconds.

  Raises:
    ValueError: the graph is not series-parallel.
  """
  w = len(widths)
  index = {k: i for i, k in enumerate(widths)}
  masks = {n: [index[k] for k in allowed(n)] for n in layers}
  has_consumer = {u for u, _ in edges}
  sinks = [n for n in layers if n not in has_consumer]
  terminal = sinks[0] if len(sinks) == 1 else SINK
  all_edges = list(edges) + ([(s, SINK) for s in sinks]
                             if terminal == SINK else [])
  masks[SINK] = list(range(w))
  masks[source] = list(range(w))

  def cost(n: str, i: int) -> float:
    return 0.0 if n in (SINK, source) else node_cost(n, widths[i])

  live: Dict[int, Tuple[str, str, List[List[float]], tuple]] = {}
  for eid, (u, v) in enumerate(all_edges):
    table = [[INF] * w for _ in range(w)]
    for a in masks[u]:
      for b in masks[v]:
        table[a][b] = (0.0 if u == source or v == SINK
                       else edge_cost(u, v, widths[a], widths[b]))
    live[eid] = (u, v, table, ("leaf",))
  next_id = len(all_edges)
  changed = True
  while changed:
    changed = False
    by_pair: Dict[Tuple[str, str], List[int]] = {}
    for eid, (u, v, _, _) in live.items():
      by_pair.setdefault((u, v), []).append(eid)
    for ids in by_pair.values():
      while len(ids) > 1:
        a, b = ids.pop(), ids.pop()
        u, v, ta, tree_a = live.pop(a)
        _, _, tb, tree_b = live.pop(b)
        table = [[ta[i][j] + tb[i][j] for j in range(w)] for i in range(w)]
        live[next_id] = (u, v, table, ("parallel", tree_a, tree_b))
        ids.append(next_id)
        next_id += 1
        changed = True
    ins: Dict[str, List[int]] = {}
    outs: Dict[str, List[int]] = {}
    for eid, (u, v, _, _) in live.items():
      outs.setdefault(u, []).append(eid)
      ins.setdefault(v, []).append(eid)
    done = set()
    for mid in list(ins):
      if mid in (source, terminal) or mid in done:
        continue
      if len(ins[mid]) != 1 or len(outs.get(mid, [])) != 1:
        continue
      e1, e2 = ins[mid][0], outs[mid][0]
      if e1 not in live or e2 not in live:
        continue
      u, _, t1, tree1 = live.pop(e1)
      _, v, t2, tree2 = live.pop(e2)
      table = [[INF] * w for _ in range(w)]
      choice = [[0] * w for _ in range(w)]
      for i in range(w):
        for j in range(w):
          best, arg = INF, masks[mid][0]
          for m in masks[mid]:
            total = t1[i][m] + cost(mid, m) + t2[m][j]
            if total < best:
              best, arg = total, m
          table[i][j], choice[i][j] = best, arg
      live[next_id] = (u, v, table, ("series", mid, choice, tree1, tree2))
      next_id += 1
      done.update((mid, u, v))
      changed = True
  if len(live) != 1:
    leftover = sorted({u for u, _, _, _ in live.values()} - {source})
    raise ValueError(f"the layer graph is not series-parallel: {len(live)} "
                     f"edges remain after reduction, e.g. at layer "
                     f"{leftover[0]!r}; the burst planner needs blocks "
                     "whose branches fork and join at one layer each")
  (_, _, table, tree), = live.values()
  best, best_ij = INF, (0, 0)
  for i in range(w):
    for j in masks[terminal]:
      total = table[i][j] + cost(terminal, j)
      if total < best:
        best, best_ij = total, (i, j)
  labels = {terminal: best_ij[1]}
  _read_back(tree, best_ij[0], best_ij[1], labels)
  labels.pop(SINK, None)
  return {n: widths[i] for n, i in labels.items() if n != source}, best


def _read_back(tree: tuple, i: int, j: int, labels: Dict[str, int]) -> None:
  """Walks the reduction tree, assigning each collapsed layer its argmin."""
  stack = [(tree, i, j)]
  while stack:
    node, a, b = stack.pop()
    if node[0] == "series":
      _, mid, choice, left, right = node
      m = choice[a][b]
      labels[mid] = m
      stack += [(left, a, m), (right, m, b)]
    elif node[0] == "parallel":
      stack += [(node[1], a, b), (node[2], a, b)]
