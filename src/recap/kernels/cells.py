"""Calibration cells, compiled: which cell a candidate falls in, and the one rule that updates
a cell's counts (``recap.core.calibration.Calibration`` and the compiled learning step both use it).

A cell is (source, depth, bin): ``source`` one of ``codes.CALIBRATED_SOURCES``, depth 1, 2 or
>= 3, and a bin of the candidate's fused q (``codes.Q_EDGES``) or, for the suffix continuation,
of its match length (1..16).
"""

from __future__ import annotations

import numpy as np

from ..codes import (
    MAX_WEIGHT,
    N_BINS,
    N_DEPTHS,
    PRIOR_WEIGHT,
    Q_EDGES,
    SOURCE_FREQUENCY,
    SOURCE_ORDER1,
    SOURCE_ORDER2,
    SOURCE_ORDER3,
    SOURCE_PERSISTENT2,
    SOURCE_PERSISTENT3,
    SOURCE_SUFFIX,
)
from ..jit import njit

_SUFFIX_ROW = 4  # the suffix's place in codes.CALIBRATED_SOURCES


@njit
def cell_index(source: int, depth: int, value: float) -> int:
    """The cell of a candidate: ``source`` a source code, ``depth`` >= 1 the depth it would
    take, ``value`` its fused q (or, for the suffix, the length of the suffix match). -1 for a
    source that is not calibrated."""
    if source == SOURCE_ORDER1:
        s = 0
    elif source == SOURCE_ORDER2:
        s = 1
    elif source == SOURCE_ORDER3:
        s = 2
    elif source == SOURCE_FREQUENCY:
        s = 3
    elif source == SOURCE_SUFFIX:
        s = _SUFFIX_ROW
    elif source == SOURCE_PERSISTENT2:
        s = 5
    elif source == SOURCE_PERSISTENT3:
        s = 6
    else:
        return -1
    d = min(depth, N_DEPTHS) - 1
    if s == _SUFFIX_ROW:
        b = min(max(int(value), 1), N_BINS) - 1
    else:
        b = N_BINS - 1
        while b > 0 and value < Q_EDGES[b]:
            b -= 1
    return (s * N_DEPTHS + d) * N_BINS + b


@njit
def count_trial(
    trials: np.ndarray,  # [N_CELLS] float64, updated in place
    hits: np.ndarray,  # [N_CELLS] float64, updated in place
    probs: np.ndarray,  # [N_CELLS] float64, updated in place
    prior: np.ndarray,  # [N_CELLS] float64
    cell: int,
    accepted: bool,
) -> None:
    """Count one candidate of ``cell`` verified with its parent accepted: its counts grow (and
    are halved past ``MAX_WEIGHT``, so old evidence fades) and its probability is the accepted
    share, smoothed by ``PRIOR_WEIGHT`` pseudo-observations of the prior."""
    trials[cell] += 1.0
    if accepted:
        hits[cell] += 1.0
    if trials[cell] > MAX_WEIGHT:
        trials[cell] *= 0.5
        hits[cell] *= 0.5
    probs[cell] = (hits[cell] + PRIOR_WEIGHT * prior[cell]) / (trials[cell] + PRIOR_WEIGHT)


@njit
def count_trials(trials, hits, probs, prior, cells: np.ndarray, accepted: np.ndarray) -> None:
    """``count_trial`` for each of ``cells`` [M] int64 (-1 skipped) with ``accepted`` [M] bool."""
    for j in range(cells.shape[0]):
        if cells[j] >= 0:
            count_trial(trials, hits, probs, prior, cells[j], accepted[j])


@njit
def recount(trials, hits, probs, prior) -> None:
    """Every cell's probability from its counts (after the counts were replaced), by the same rule."""
    for cell in range(trials.shape[0]):
        if trials[cell] > MAX_WEIGHT:
            trials[cell] *= 0.5
            hits[cell] *= 0.5
        probs[cell] = (hits[cell] + PRIOR_WEIGHT * prior[cell]) / (trials[cell] + PRIOR_WEIGHT)


def warm_up() -> None:
    cell_index(SOURCE_ORDER1, 1, 0.5)
    arrays = (np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3))
    count_trials(*arrays, np.array([0, -1]), np.array([True, False]))
    recount(*arrays)
