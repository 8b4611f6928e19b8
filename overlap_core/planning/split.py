"""The split both pipeline runtimes cut by: flags, a layer graph, a profile.

Each trainer reads its own model's layer graph (torch.fx, or the Keras
functional graph) and hands it here with the flags' `PipelineConfig`. The
split, its refusals and the per-stage predictions that run.json puts
beside the measurements are the same for both frameworks.

  profile = load_profile(cfg.profile)            # None without --plan_profile
  plan = plan_split(graph, cfg, microbatch_size=8, profile=profile)
  plan.cuts                                      # the layers stages end with
  stage_predictions(plan.stages[:1], num_microbatches=4)
"""

from typing import Optional, Sequence, Tuple

from overlap_core.planning import conditions, foreign, partition, report
from overlap_core.planning.graph import LayerGraph
from overlap_core.planning.profile import Profile
from overlap_core.runtime.config import ConfigError, PipelineConfig

AUTO_NEEDS_PROFILE = (
    "the runtime needs a profile to predict stage times; pass "
    "--plan_profile (python -m tfoverlap.plan or torch_parity.plan with "
    "--plan_output_dir writes profile.json), explicit cuts, or even")


def load_profile(path: str) -> Optional[Profile]:
  """The --plan_profile layer profile, or None without one.

  Raises:
    ConfigError: naming plan_profile, for a file that is not a profile.
  """
  if not path:
    return None
  try:
    with open(path, encoding="utf-8") as f:
      return Profile.from_json(f.read())
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError("plan_profile", path,
                      f"not a layer profile ({type(e).__name__}: {e}); "
                      "allowed: the JSON a plan command writes") from None


def check_profile(cfg: PipelineConfig,
                  stage: Optional[conditions.StageConditions] = None, *,
                  replan: str = "") -> str:
  """A trainer's check: refuses a profile for an unpipelined run, `auto`
  without a profile, a file that is no profile, and (given what the
  run's `stage`s get) a profile measured under other conditions, before
  any stage starts. (The flags accept --plan_profile alone: the burst
  planning command reads one without pipeline stages.)

  Args:
    cfg: the run's pipeline flags.
    stage: what each of its stages will run under; None skips that check.
    replan: the planning command to name in the refusal (`command.
      replan_command`).

  Returns:
    The one warning line for a profile another framework measured, or "".

  Raises:
    ConfigError: naming pipeline_split or plan_profile.
  """
  if cfg.stages == 1:
    if cfg.profile:
      raise ConfigError("plan_profile", cfg.profile, "applies only with "
                        "--pipeline_stages of 2 or more")
    return
  if cfg.split == "auto" and not cfg.profile:
    raise ConfigError("pipeline_split", "auto", AUTO_NEEDS_PROFILE)
  profile = load_profile(cfg.profile)
  if profile is None or stage is None:
    return ""
  conditions.check_conditions(profile, stage, path=cfg.profile,
                              replan=replan)
  return conditions.foreign_framework_warning(profile, stage,
                                              path=cfg.profile, replan=replan)


def plan_split(graph: LayerGraph, cfg: PipelineConfig, *,
               microbatch_size: int,
               profile: Optional[Profile] = None,
               framework: str = "") -> partition.StagePlan:
  """The S*V stages of the flags' split, with their predicted costs.

  `even` and explicit cuts need only the graph; `auto` needs a profile:
  the runtime refuses it without one rather than profile for minutes
  before training. With a profile, the cost model fitted on it predicts
  every stage's time at `microbatch_size`; without one the stages' times
  are zero. A profile another framework than `framework` (the first word
  of the profiles this side writes) measured is read onto the graph
  first, and cut layers may be given in either framework's spelling
  (`foreign`).

  Raises:
    ConfigError: naming pipeline_split (or plan_profile), for a split the
      graph or the profile cannot take.
  """
  if cfg.split == "auto" and profile is None:
    raise ConfigError("pipeline_split", "auto", AUTO_NEEDS_PROFILE)
  num_stages = cfg.stages * cfg.virtual_stages
  cut_layers = tuple(foreign.resolve_layer(graph, c) for c in cfg.cut_layers)
  if (profile is not None and framework and
      not profile.framework.lower().startswith(framework)):
    try:
      profile = foreign.translate_profile(profile, graph)
    except ValueError as e:
      raise ConfigError("plan_profile", cfg.profile, str(e)) from None
  try:
    if profile is not None:
      return report.make_plan(
          graph, profile, num_stages=num_stages,
          microbatch_size=microbatch_size,
          num_microbatches=cfg.microbatches, split=cfg.split,
          cut_layers=cut_layers).plan
    return partition.partition(
        graph, {n.name: 0.0 for n in graph.nodes}, num_stages=num_stages,
        batch_size=microbatch_size, mode=cfg.split,
        cut_layers=cut_layers)
  except KeyError as e:
    raise ConfigError("plan_profile", cfg.profile,
                      str(e).strip("'\"")) from None
  except ValueError as e:
    raise ConfigError("pipeline_split", cfg.split or "even",
                      str(e)) from None


def stage_predictions(stages: Sequence[partition.Stage], *,
                      num_microbatches: int, with_update: bool = True
                      ) -> Tuple[Optional[float], Optional[float],
                                 Optional[float]]:
  """(ms per step, of which update ms, MiB) of the stages one device runs.

  The plan predicts one micro-batch's forward + backward (and its
  transfers at the planned bandwidth); a step runs M of them, adds the
  gradients of M - 1 into the first's, and runs the optimizer's update
  once (`with_update=False` leaves it out, for a runtime whose measured
  stage time does not hold it). The memory is
  parameters plus one micro-batch's activations, what the plan's table
  shows; optimizer state and in-flight micro-batches come on top.
  (None, None, None) for no stages.
  """
  if not stages:
    return None, None, None
  update_ms = 1e3 * sum(s.update_s for s in stages) if with_update else 0.0
  predicted_ms = 1e3 * sum(s.step_s(num_microbatches) - s.update_s
                           for s in stages) + update_ms
  predicted_mb = sum(s.param_bytes + s.activation_bytes
                     for s in stages) / 2**20
  return predicted_ms, update_ms, predicted_mb
