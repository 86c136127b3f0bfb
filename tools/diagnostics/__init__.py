"""One-off diagnostics of the embedded models, cited by the notes in docs/experiments.

Run from the repository root as modules, e.g. ``python -m tools.diagnostics.seed_by_kind --help``.
"""
