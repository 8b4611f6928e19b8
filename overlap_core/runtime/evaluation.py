"""The evaluation result both trainers report, framework-neutral.

Each side runs its model over the evaluation data and sums, over every
replica, three numbers: the per-example loss, the per-example quality (1 for
a correct prediction, or the image's PSNR in dB) and the example count.
Turning those sums into run.json's `final` entries happens here, once, so
both frameworks name and average them the same way.

  evaluation_result(zoo.CLASSIFICATION, loss_sum=36.0, quality_sum=351.0,
                    count=360.0)
  # {"eval_loss": 0.1, "eval_accuracy": 0.975, "eval_examples": 360}
"""

from overlap_core.runtime import zoo


def evaluation_result(task: str, *, loss_sum: float, quality_sum: float,
                      count: float) -> dict:
  """Per-example means of the summed loss and quality.

  Args:
    task: zoo.CLASSIFICATION or zoo.SUPER_RESOLUTION.
    loss_sum: the per-example losses summed over all replicas.
    quality_sum: correct predictions, or PSNRs in dB, summed the same way.
    count: the number of examples the sums cover.

  Returns:
    {"eval_loss", "eval_accuracy"} for classification, {"eval_loss",
    "eval_psnr_db"} for super-resolution, {"eval_loss" (the mean squared
    error), "eval_mean_abs_error"} for regression, and "eval_examples"; {} when
    `count` is 0 (no replica saw an example).
  """
  if not count:
    return {}
  quality_key = {zoo.SUPER_RESOLUTION: "eval_psnr_db",
                 "regression": "eval_mean_abs_error"}.get(task,
                                                          "eval_accuracy")
  return {
      "eval_loss": loss_sum / count,
      quality_key: quality_sum / count,
      "eval_examples": int(count),
  }
