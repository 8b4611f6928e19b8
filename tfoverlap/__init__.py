"""tfoverlap: measure and control how training overlaps combine.

Importing this package imports no framework: `tfoverlap.core` is shared with
the PyTorch side, and the TensorFlow modules are imported where they are used.
"""

__version__ = "0.1.0"
