"""The test suite, a package so that test modules are named by their path.

Each folder mirrors a package of the project (tests/overlap_core/checkpoint
tests overlap_core/checkpoint), so the two framework sides' tests of one
concept share a file name (tests/tfoverlap/test_data.py and
tests/torch_parity/test_data.py) without pytest mistaking one for the other.
"""
