"""Named constants shared by the model-free core and the compiled kernels, defined once.

A leaf module: it imports nothing of recap, so the kernels (which see plain ints) and the
Python code (which sees ``recap.Source``) read the same numbers.
"""

from __future__ import annotations

import numpy as np

# -- where a draft node came from (``recap.core.tree.Source`` names them) ---------------------
SOURCE_ROOT = 0
SOURCE_ORDER1 = 1  # the persistent token memory (1-token key)
SOURCE_ORDER2 = 2  # the request-local 2-token memory
SOURCE_ORDER3 = 3  # the request-local 3-token memory
SOURCE_SUFFIX = 4  # the suffix-matched continuation
SOURCE_TEMPLATE = 5  # Token Recycling's static template
SOURCE_NGRAM = 6  # prompt lookup
SOURCE_FREQUENCY = 7  # RECAP's fallback: the request's most frequent tokens
SOURCE_PERSISTENT2 = 8  # the persistent 2-token memory (ours: where the request has no 2-token row)
SOURCE_PERSISTENT3 = 9  # the persistent 3-token memory (likewise)

# -- methods whose token memory persists across requests (and can be saved to a file) --------
PERSISTENT_METHODS = ("recap", "token_recycling")

# -- fusion ----------------------------------------------------------------------------------
FUSION_MODES = ("entropy", "fixed", "strict")  # codes 0, 1, 2 in the kernels, in this order
# "fixed" fusion: the weight of the 1st, 2nd, 3rd (and any further) row found for a context
FIXED_FUSION_WEIGHTS = (0.70, 0.20, 0.10, 0.05)

# -- calibration cells: (source, depth, bin of q) --------------------------------------------
# calibrated sources, in cell order: order 1, order 2, order 3, frequency fallback, suffix,
# persistent order 2, persistent order 3
CALIBRATED_SOURCES = (
    SOURCE_ORDER1, SOURCE_ORDER2, SOURCE_ORDER3, SOURCE_FREQUENCY, SOURCE_SUFFIX, SOURCE_PERSISTENT2,
    SOURCE_PERSISTENT3,
)  # fmt: skip
N_SOURCES = len(CALIBRATED_SOURCES)
N_DEPTHS = 3  # depth 1, 2, >= 3
N_BINS = 16
N_CELLS = N_SOURCES * N_DEPTHS * N_BINS
# lower edges of the q bins (the last bin is [0.99, 1])
Q_EDGES = np.array([0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99])
PRIOR_WEIGHT = 4.0  # pseudo-observations of the prior in each cell
MAX_WEIGHT = 4096.0  # a cell's counts are halved past this, so old evidence fades

# -- packed context keys ---------------------------------------------------------------------
TOKEN_BITS = 21  # bits per token in a packed 2-/3-token key (token ids below 2**21)
MAX_TOKEN = (1 << TOKEN_BITS) - 1
EMPTY = -1  # a free slot of a context table
MIN_CONTEXT_ROWS = 512  # the smallest budget of kept 2-/3-token rows (TokenMemory.max_context_rows)
