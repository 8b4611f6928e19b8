"""torch_parity: the PyTorch mirror of tfoverlap's TensorFlow main path.

The same flags, model names and overlap knobs mean the same thing here as in
`tfoverlap/`, so a run in one framework can be compared with a run in the
other. It shares the framework-neutral `overlap_core` (config, zoo, ledger,
run record, reports) and never imports TensorFlow.
"""
