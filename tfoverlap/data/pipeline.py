"""The tf.data input pipeline, with every input-overlap knob in its place.

Order of the transformations, and why:

  read -> [shard] -> decode map -> [cache] -> [shuffle] -> [repeat]
       -> [skip, on resume] -> [preprocess-cost map] -> batch -> [low-res pairs]
       -> [data service] -> [prefetch]

- shard first, so each input pipeline reads and decodes only its share.
- cache right after decode: it keeps decoded pixels, so later epochs skip
  reading and decoding, but the per-sample cost below still runs every
  epoch, as random augmentation would.
- shuffle before repeat, so every epoch is a full permutation and epoch
  boundaries stay visible; shuffle after cache, so each epoch is reshuffled.
- a resumed run skips the samples already trained on after repeat and
  before the cost map, so the order is the uninterrupted run's and the
  skipped samples cost no preprocessing.
- the cost map after repeat (per sample, train only): it is the work whose
  parallelism `--map_parallelism` is about.
- batch, then the super-resolution pairs, on whole batches (one resize op
  per batch instead of one per sample).
- the data service takes everything before it to its workers.
- prefetch last, so it overlaps the whole pipeline, service reads included,
  with the training step.

`split="eval"` reads one pass in file order, with no cost map, and keeps the
final partial batch: every evaluation sees every example exactly once.
"""

from typing import Callable, Optional

import tensorflow as tf

from overlap_core.runtime import datasets
from overlap_core.runtime.config import AUTOTUNE, ConfigError, DataConfig
from overlap_core.runtime.datasets import SPLITS, TASKS  # pylint: disable=unused-import
from tfoverlap.data import preprocess_cost, service, sources

LOW_RES_METHOD = "area"  # averages whole pixels: stays in [0, 1], no ringing

InputFn = Callable[[Optional[tf.distribute.InputContext]], tf.data.Dataset]


def make_input_fn(cfg: DataConfig, *, split: str, task: str, seed: int,
                  upscale: int = 1, start_batch: int = 0) -> InputFn:
  """Builds the input function a strategy calls once per input pipeline.

  The source is opened, and the preprocessing cost calibrated, now: errors
  surface before training starts, and the returned function does no I/O
  beyond building the dataset.

  Args:
    cfg: the data configuration. `cfg.data_service` must be empty or an
      address; the trainer replaces "local" by `start_data_service().address`.
    split: "train" (shuffled, repeated forever, cost applied, full batches)
      or "eval" (one pass, in order, no cost, final partial batch kept).
    task: "classification" -> (images [B, S, S, 3] float32 in [0, 1],
      labels [B] int32); "super_resolution" -> (low_res [B, S/u, S/u, 3],
      high_res [B, S, S, 3]), low_res being the area resize of high_res.
    seed: shuffle seed of this run.
    upscale: super-resolution factor u; must divide cfg.image_size.
    start_batch: global batches a resumed run has already trained on; the
      first batch yielded is the one an uninterrupted run would yield next.

  Returns:
    `input_fn(ctx)` -> a dataset of per-replica batches:
    `ctx.get_per_replica_batch_size(cfg.batch_size)` examples, or
    `cfg.batch_size` when ctx is None.

  Raises:
    ConfigError: the data set is missing or unreadable; evaluation of a
      data set without an evaluation split; image_size not a multiple of
      upscale.
    ValueError: unknown split or task, or data_service still "local".
  """
  datasets.check_input_request(split=split, task=task,
                               image_size=cfg.image_size, upscale=upscale)
  if cfg.data_service == "local":
    raise ValueError("data_service='local': start_data_service() first and "
                     "pass its address in cfg.data_service")
  source = sources.load_source(cfg)
  if split == "eval" and not source.num_examples["eval"]:
    raise datasets.no_eval_split_error(source.name)
  training = split == "train"
  cost_fn = (preprocess_cost.make_cost_fn(cfg.preprocess_cost_ms)
             if training and cfg.preprocess_cost_ms > 0 else None)
  job_name = (service.next_job_name(split, task, seed)
              if cfg.data_service else None)
  parallel_calls = _parallel_calls(cfg.map_parallelism)
  low_res_size = cfg.image_size // upscale

  def to_low_high_pair(high_res, _labels):
    low_res = tf.image.resize(high_res, [low_res_size, low_res_size],
                              method=LOW_RES_METHOD)
    return low_res, high_res

  def input_fn(ctx: Optional[tf.distribute.InputContext] = None):
    batch_size = (ctx.get_per_replica_batch_size(cfg.batch_size)
                  if ctx is not None else cfg.batch_size)
    ds = source.read(split)
    # With the data service the job spreads batches over consumers; sharding
    # too would give each consumer a different dataset for one shared job.
    if ctx is not None and ctx.num_input_pipelines > 1 and not job_name:
      ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    if source.decode is not None:  # the user's callable decodes its own
      ds = ds.map(source.decode, num_parallel_calls=parallel_calls)
    if cfg.cache:
      ds = ds.cache()
    if training:
      if cfg.shuffle_buffer:
        ds = ds.shuffle(cfg.shuffle_buffer, seed=seed,
                        reshuffle_each_iteration=True)
      ds = ds.repeat()
      if start_batch:
        # Skipped before the cost map: resuming replays only reading,
        # decoding and shuffling, which are what fix the order.
        pipelines = ctx.num_input_pipelines if ctx is not None else 1
        ds = ds.skip(start_batch * (cfg.batch_size // pipelines))
      if cost_fn is not None:
        ds = ds.map(cost_fn, num_parallel_calls=parallel_calls)
    ds = ds.batch(batch_size, drop_remainder=training)
    if task == "super_resolution" and not source.user:
      ds = ds.map(to_low_high_pair, num_parallel_calls=parallel_calls)
    # Options set here travel with the graph to the service's workers.
    ds = ds.with_options(_options(cfg))
    if job_name:
      ds = service.apply_data_service(ds, cfg.data_service, job_name)
    if cfg.prefetch:
      ds = ds.prefetch(tf.data.AUTOTUNE if cfg.prefetch == AUTOTUNE
                       else cfg.prefetch)
    return ds.with_options(_options(cfg))

  return input_fn


def _parallel_calls(map_parallelism: int) -> Optional[int]:
  """`num_parallel_calls` for a map: None runs it inline, on the caller."""
  if map_parallelism == AUTOTUNE:
    return tf.data.AUTOTUNE
  if map_parallelism < 1:
    raise ConfigError("map_parallelism", map_parallelism,
                      "allowed: autotune or an integer >= 1")
  # 1 means sequential: a plain map, not a one-thread parallel map, which
  # would still overlap the map with its consumer.
  return None if map_parallelism == 1 else map_parallelism


def _options(cfg: DataConfig) -> tf.data.Options:
  """Turns off the default rewrites that would overrule a knob set to off.

  tf.data's default graph optimizations add overlap on their own: they
  parallelize a plain map (map_parallelization), fuse map and batch into an
  op that computes batches ahead (map_and_batch_fusion) and append an
  autotuned prefetch (inject_prefetch). Each is disabled exactly when the
  knob it would contradict says "off".
  """
  options = tf.data.Options()
  if cfg.map_parallelism == 1:
    options.experimental_optimization.map_parallelization = False
  if cfg.prefetch == 0:
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_and_batch_fusion = False
  return options
