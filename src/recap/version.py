"""recap's version (a leaf: memory files record it, the package exports it)."""

__version__ = "0.1.0"
