"""tfoverlap: measure and control how training overlaps combine.

The TensorFlow/Keras side. Importing this package imports no framework: the
TensorFlow modules are imported where they are used, and what both sides
share is in `overlap_core`.
"""

from overlap_core import __version__  # noqa: F401 (declared once there)
