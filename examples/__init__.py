"""Worked examples: a model and a dataset of the user's own, per package.

Each package is imported by the trainers as `examples.<name>.<module>:
<callable>` from the repository's root; its README.md shows the commands.
"""
