"""Repository tools that are not part of the installed library (the wheel holds ``src/recap`` only).

Run them from the repository root, e.g. ``python -m tools.zoo_training.train --help``.
"""
