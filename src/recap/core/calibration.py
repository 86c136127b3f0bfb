"""Calibrated draft scores: how often a drafted token is accepted, learned as decoding goes.

A memory row's fused probability q is not the chance that the target's argmax is that token:
a 1-token row at q = 0.97 was accepted 63% of the time on the embedded Qwen model, a 3-token
row at the same q 92%. So each candidate falls into a cell, (where it came from, its depth,
a bin of q), and the cell's score is the observed acceptance rate of candidates in that cell
whose parent was accepted: P(accepted | parent accepted). The product of those along a path
estimates the chance the whole path is accepted, so the sum over a tree's nodes estimates the
tokens a step commits: best-first search on these scores maximises that estimate for every
node budget, and the budget can be chosen from it (``recap.core.step_cost``).

Sources: the 1-, 2- and 3-token memories and the persistent 2-/3-token memories (by the most
specific row holding the token), the frequency fallback (bins of q), and the suffix
continuation (bins of the suffix match length).
"""

from __future__ import annotations

import threading

import numpy as np

from ..codes import N_BINS, N_CELLS, N_DEPTHS, N_SOURCES, Q_EDGES
from ..kernels.cells import cell_index, count_trials, recount

__all__ = ["N_CELLS", "Calibration", "cell_index", "prior"]

_Q_MIDPOINTS = np.append((Q_EDGES[1:] + Q_EDGES[:-1]) / 2, 0.995)


def prior() -> np.ndarray:
    """[N_CELLS] prior acceptance rates: a share of q for the memories (more of it for longer
    keys), a little more for each token of suffix match. Observations soon outweigh them."""
    p = np.empty((N_SOURCES, N_DEPTHS, N_BINS))
    for s, share in enumerate((0.6, 0.75, 0.85, 0.3)):
        p[s] = share * _Q_MIDPOINTS
    p[4] = np.minimum(0.8, 0.04 * np.arange(1, N_BINS + 1))[None, :]
    p[5] = 0.7 * _Q_MIDPOINTS
    p[6] = 0.75 * _Q_MIDPOINTS
    return p.reshape(-1)


class Calibration:
    """Acceptance counts per cell (thread-safe); shared by the requests on one memory."""

    def __init__(self) -> None:
        self.prior = prior()
        self.trials = np.zeros(N_CELLS)
        self.accepted = np.zeros(N_CELLS)
        self.lock = threading.Lock()
        self._probs = self.prior.copy()

    @property
    def observations(self) -> int:
        return int(self.trials.sum())

    def probabilities(self) -> np.ndarray:
        """[N_CELLS] float64: the estimated P(accepted | parent accepted) of each cell."""
        return self._probs

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (trials, accepted) [N_CELLS], taken under the lock."""
        with self.lock:
            return self.trials.copy(), self.accepted.copy()

    def set_counts(self, trials: np.ndarray, accepted: np.ndarray) -> None:
        """Replace the counts (a loaded memory's); 0 <= accepted <= trials."""
        trials, accepted = np.asarray(trials, dtype=np.float64), np.asarray(accepted, dtype=np.float64)
        if trials.shape != (N_CELLS,) or accepted.shape != (N_CELLS,) or (accepted > trials).any():
            raise ValueError(f"calibration counts must be two [{N_CELLS}] arrays with 0 <= accepted <= trials")
        with self.lock:
            self.trials[:], self.accepted[:] = trials, accepted
            self.refresh()

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(trials, accepted, probabilities, prior), as the compiled learning step updates them
        in place (under ``lock``)."""
        return self.trials, self.accepted, self._probs, self.prior

    def refresh(self) -> None:
        """Recompute the probabilities after the counts changed (the caller holds ``lock``)."""
        recount(*self.arrays)

    def update(self, cells: np.ndarray, accepted: np.ndarray) -> None:
        """Count candidates that were verified with their parent accepted: ``cells`` [M] int
        (-1 ignored) and whether each was accepted [M] bool."""
        cells = np.ascontiguousarray(cells, dtype=np.int64)
        accepted = np.ascontiguousarray(accepted, dtype=np.bool_)
        with self.lock:
            count_trials(*self.arrays, cells, accepted)
