"""Top-k predictions of the target at verified positions, on the host."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..kernels.tables import row_concentrations


@dataclass(frozen=True)
class TopK:
    """The target's k most likely next tokens at N positions.

    ids:   [N, k] int64, best first
    probs: [N, k] float32, full-vocabulary softmax probabilities of ``ids``
    (both stored contiguous, converted if need be)
    """

    ids: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        # contiguous int64 / float32, the layout the compiled memory writes take
        object.__setattr__(self, "ids", np.ascontiguousarray(self.ids, dtype=np.int64))
        object.__setattr__(self, "probs", np.ascontiguousarray(self.probs, dtype=np.float32))
        if self.ids.shape != self.probs.shape or self.ids.ndim != 2:
            raise ValueError(f"TopK ids {self.ids.shape} and probs {self.probs.shape} must both be [N, k]")

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def k(self) -> int:
        return self.ids.shape[1]

    @cached_property
    def concentration(self) -> np.ndarray:
        """kappa = exp(-H) of each row, H the entropy of the k probabilities plus one
        residual bucket holding the mass outside them. [N] float32, in (0, 1]."""
        return row_concentration(self.probs)


def row_concentration(probs: np.ndarray) -> np.ndarray:
    """exp(-entropy) of rows of probabilities [N, k] completed by a residual bucket. [N] float32"""
    return row_concentrations(np.ascontiguousarray(probs, dtype=np.float32))
