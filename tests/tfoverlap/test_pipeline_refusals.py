"""What the TensorFlow pipeline refuses: one readable line per reason.

The flags are parsed as the trainer parses them and the refusal is asked
of the trainer's `check_supported` in-process; one command line checks
that the trainer turns a refusal into exit status 2 and one line.
"""

import keras
import pytest
from absl.testing import flagsaver

import flags as tfo_flags
from overlap_core.runtime.config import ConfigError
from tfoverlap import pipeline, trainer
from tfoverlap.models import build_model

from tests.helpers import run_module

tfo_flags.define_flags()
if not tfo_flags.FLAGS.is_parsed():
  tfo_flags.FLAGS.mark_as_parsed()

# A pipeline the TensorFlow runtime runs: 2 stages on the 2 mirrored
# devices, the whole batch of 16 in 4 micro-batches.
RUNNABLE = dict(pipeline_stages="2", pipeline_microbatches="4",
                pipeline_split="even", strategy="mirrored", num_devices="2",
                batch_size="16")


def _config(**changes):
  with flagsaver.as_parsed(**{**RUNNABLE, **changes}):
    return tfo_flags.to_config()


def test_the_runnable_pipeline_is_not_refused():
  trainer.check_supported(_config(), num_gpus=0)


@pytest.mark.parametrize("changes, line", [
    (dict(pipeline_schedule="1f1b"),
     "--pipeline_schedule=1f1b: 1F1B frees a micro-batch's activations"),
    (dict(pipeline_schedule="interleaved_1f1b", pipeline_virtual_stages="2"),
     "--pipeline_schedule=interleaved_1f1b: virtual stages interleave"),
    (dict(pipeline_schedule="zero_bubble", pipeline_virtual_stages="2"),
     "--pipeline_schedule=zero_bubble: zero-bubble splits backward"),
    (dict(strategy="multi_worker", num_workers="2"),
     "--strategy=multi_worker: data parallelism across pipelines is not "
     "built in TensorFlow"),
    (dict(strategy="default"),
     "--strategy=default: pipeline stages run on the --num_devices local "
     "devices"),
    # 4 devices for 2 stages would be 2 pipelines' replicas.
    (dict(num_devices="4"),
     "--num_devices=4: data parallelism across pipelines"),
    (dict(all_reduce="ring"), "--all_reduce=ring: one pipeline runs no "
     "all-reduce"),
    (dict(precision="mixed_float16"),
     "--precision=mixed_float16: the pipelined step runs no loss scaling"),
    (dict(offload="activations"),
     "--offload=activations: offload wraps layers the stages share"),
    (dict(loop="fit"), "--loop=fit: the trainer splits a pipelined step's "
     "time in its custom loop"),
])
def test_each_refusal_is_one_line_naming_the_flag(changes, line):
  config = _config(**changes)
  with pytest.raises(ConfigError) as raised:
    trainer.check_supported(config, num_gpus=0)
  message = str(raised.value)
  assert message.startswith(line), message
  assert "\n" not in message and "allowed" in message


def test_the_trainer_exits_2_with_the_refusal_alone(tmp_path):
  result = run_module(
      "tfoverlap.train", *(f"--{k}={v}" for k, v in RUNNABLE.items()),
      "--pipeline_schedule=1f1b", "--model=small_cnn", "--image_size=8",
      f"--model_dir={tmp_path}", timeout=180)
  assert result.returncode == 2, result.stderr
  # TensorFlow's own start-up log lines may come first; ours is one line.
  errors = [l for l in result.stderr.splitlines() if ": error: " in l]
  assert len(errors) == 1, result.stderr
  assert "--pipeline_schedule=1f1b: 1F1B frees" in errors[0]
  assert "Traceback" not in result.stderr
  assert not list(tmp_path.iterdir())  # refused before anything ran


def test_a_model_with_two_inputs_or_outputs_is_refused():
  one = build_model("small_cnn", image_size=8, num_classes=10)
  first = keras.Input((4,), name="a")
  second = keras.Input((4,), name="b")
  hidden = keras.layers.Dense(4, name="hidden")(
      keras.layers.Concatenate(name="joined")([first, second]))
  two_in = keras.Model([first, second], keras.layers.Dense(2)(hidden))
  two_out = keras.Model(one.inputs, [one.outputs[0], one.outputs[0] * 2])
  for model, counts in ((two_in, "2 inputs and 1 outputs"),
                        (two_out, "1 inputs and 2 outputs")):
    with pytest.raises(ValueError, match=f"{model.name}' with {counts}; "
                       "allowed: a functional model with one input and one "
                       "output"):
      pipeline.build_stages(model, ["hidden"])
