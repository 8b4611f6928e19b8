"""The training runtime both trainers share.

  config            the frozen TrainConfig that flags become; ConfigError
  zoo               model names, their task and minimum input size
  datasets          dataset descriptions and the embedded digits split
  ledger            StepLedger: timed phases per step and their summaries
  loop_context      what every loop does after a step
  progress          progress lines while training
  summary           the end-of-run breakdown table and final line
  trace             Chrome-trace/Perfetto JSON of the ledger's spans
  run_record        the run.json schema, atomic JSON writes, weights digest
  outputs           one worker's outputs (trace, run.json), written the same
                    way by both trainers
  entry_point       the trainers' shared main(): parse, train, report, exit
  evaluation        the eval result from summed losses, quality and count
  cost_calibration  --preprocess_cost_ms: the probe's rate and rounds
  processes         launchers' process supervision
  cluster           the cluster a worker reads from TF_CONFIG, Slurm or torchrun
  offload_stats     offload copy counts and times: run.json's offload
  pipeline_stats    a pipeline stage's compute, bubble and transfer per
                    step: run.json's pipeline section
"""
