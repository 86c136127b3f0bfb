"""Errors raised to users; each message says what was wrong and what to do."""


class RecapError(Exception):
    """Base class of recap's own errors."""


class UnsupportedModelError(RecapError, ValueError):
    """The model (architecture, attention implementation) cannot be verified against."""


class UnsupportedGenerationError(RecapError, ValueError):
    """A generation setting that recap does not reproduce exactly (sampling, beams, ...)."""


class InputError(RecapError, ValueError):
    """Inputs recap cannot decode (batch > 1, padding, missing input_ids)."""


class MemoryFileError(RecapError, ValueError):
    """A memory file that is missing, corrupt, or belongs to another model."""
