"""The PyTorch trainer's per-step bookkeeping in a plain loop, switched on
and off in blocks of steps of one loop: `fit_ledger_blocks`' comparison on
the `nn.Module` example.

  python -m benchmarks.loop_ledger_blocks --intra_op_threads=1 \
      --inter_op_threads=1                  # the PyTorch example, 31 loops
  python -m benchmarks.loop_ledger_blocks --quick   # smoke run

The trainer's loop (`torch_parity.loops.run_custom_loop`) times each
step's wait for its batch and its compute, and closes the step with the
ledger's `after_step`; `torch_parity.ledger.LoopLedger` is that
bookkeeping for a loop the user wrote. Each repeat is one loop of the
example's model, optimizer, loss and batches as the plain baseline sets
them up (`plain_torch_loop.prepare`), each step the plain loop's
(`plain_torch_loop.train_step`). In the "on" blocks a step takes its batch
inside `ledger.data_wait()` and ends with `ledger.step(loss)`; in the "off"
blocks it does neither. The ledger ends a step when the next batch is
asked for inside it, so the closing of an "on" block's last step falls in
the next "on" step. The blocks, the stamp at each step's end, the warm-up
cycle, the measure and the target are `fit_ledger_blocks`'.

What it leaves out, by design: what the trainer does outside the steps,
and its own loader; both sides here are the same loop over the same
loader. Section 18's whole runs hold those.
"""

import time

from benchmarks import fit_ledger_blocks as blocks

NAME = "loop_ledger_blocks"
EXAMPLE = "torch_module"


def _prepare_loop(config):
  """The example's model, optimizer, loss and batches, its first cycle of
  steps run once (none counted)."""
  # pylint: disable=g-import-not-at-top
  from benchmarks import plain_torch_loop
  # pylint: enable=g-import-not-at-top
  prepared = plain_torch_loop.prepare(config)
  for _ in range(blocks.CYCLE_STEPS):
    plain_torch_loop.train_step(prepared, config.model.precision,
                                *next(prepared.batches))
  return prepared


def loop_once(prepared, config, steps: int, run_dir: str) -> dict:
  """One loop of `steps` steps with the gated ledger; its result."""
  # pylint: disable=g-import-not-at-top
  from benchmarks import plain_torch_loop
  from torch_parity.ledger import LoopLedger
  # pylint: enable=g-import-not-at-top
  precision, batches = config.model.precision, prepared.batches
  stamps_s = []
  start_s = time.perf_counter()
  with LoopLedger(run_dir, model=prepared.model,
                  batch_size=config.data.batch_size,
                  progress=False) as ledger:
    for index in range(steps):
      if blocks.block_side(index) == blocks.ON:
        with ledger.data_wait():
          inputs, targets = next(batches)
        ledger.step(plain_torch_loop.train_step(prepared, precision, inputs,
                                                targets))
      else:
        plain_torch_loop.train_step(prepared, precision, *next(batches))
      stamps_s.append(time.perf_counter())
  return blocks.blocks_result(stamps_s, steps, time.perf_counter() - start_s,
                              run_dir)


def measure(args, passthrough, repeats: int, scratch_root: str):
  return blocks.measure_blocks(NAME, EXAMPLE, args, passthrough, repeats,
                               scratch_root, prepare=_prepare_loop,
                               run_once=loop_once)


if __name__ == "__main__":
  blocks.main_for(NAME, __doc__, measure)
