"""Frozen, validated configuration of the drafters and the decode loop."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from .codes import FIXED_FUSION_WEIGHTS, FUSION_MODES

__all__ = ["DEFAULT_HIT_MASSES", "FIXED_FUSION_WEIGHTS", "FUSION_MODES", "RecapConfig"]

SCORINGS = ("calibrated", "hit-mass")
WRITE_SCOPES = ("full-tree", "committed")
DEFAULT_HIT_MASSES = (0.68, 0.63, 0.50, 0.43, 0.40, 0.38)


@dataclass(frozen=True)
class RecapConfig:
    """Every knob of RECAP and of the baselines that share its decode loop.

    RECAP: ``k`` candidates per memory row; ``key_orders`` the context lengths used as keys
    (1 = the persistent token memory, 2/3 = request-local contextual memories); ``fusion``
    how the rows found for a context are merged; ``specificity`` the prior weight of each
    key order (orders 1, 2, 3) in entropy fusion; ``node_budget`` draft nodes per step (root
    excluded), ``max_depth`` and ``max_width`` bound the tree; ``hit_masses`` the per-depth
    factor of best-first scores (the last value repeats deeper); ``suffix_tokens`` the
    length of the suffix-matched continuation grafted from the root (0 turns it off);
    ``write_scope`` which verified nodes write rows; ``persistent`` whether the token memory
    is kept across requests; ``seed_from_prefill`` whether prompt logits seed it, and
    ``seed_context_from_prefill`` whether they also seed the 2-/3-token memories;
    ``frequency_fallback`` whether a node whose context has no row in any memory gets the
    request's ``k`` most frequent tokens as candidates (q = their share of the request's
    tokens) instead of no children. ``persistent_context`` (ours): the 2-/3-token rows are
    also kept across requests, on the token memory object (bounded by its ``max_context_rows``:
    the least recently used rows are evicted), and used where the
    request has no row of its own for a key (the request's own rows, conditioned on its
    image, always come first).

    ``scoring``: "calibrated" (ours, the default) scores a candidate by the acceptance rate
    observed for candidates like it (``recap.core.calibration``: by source, depth and q), so a
    node's score estimates the chance its path is accepted; the suffix continuation then
    competes with the other candidates for the budget. "hit-mass" is the paper's score
    (score(parent) x hit mass of the depth x q), with the suffix path grafted on top of the
    budget. ``adaptive_budget`` (default on): each step verifies the size of the best-first
    tree, up to ``node_budget`` nodes besides the root (0: a plain step), that commits the
    most tokens per second on this model and machine (``recap.core.step_cost``); off, every step
    verifies ``node_budget`` nodes. ``adaptive_threads`` (ours, default on; with the adaptive
    budget, on a CPU): each step runs on the torch thread count, the caller's or fewer, that its
    step times show fastest (``recap.core.threads``: with another process on one of two cores, a
    step on one thread ran 3x faster than on two); the caller's count is set back when the call
    ends. Neither changes the output, only the speed. ``row_value`` (ours, with the adaptive budget
    and the full-tree write scope): the tokens each of the first ``row_value_nodes`` drafted nodes
    is counted as worth in later steps, besides its chance of being accepted now, when the size is
    chosen: every verified node writes its top-k rows, and later steps draft from them (measured on
    the embedded models, 2-31 drafts every step: 0.03-0.05 tokens per step for each node written
    beyond the accepted path, and MAL 1.37 against 1.71 at 8 drafts when only the path writes). A
    size chosen for this step's tokens alone would take plain steps and small trees that starve
    the memory. 0 turns it off. ``row_value_needs_drafts`` (default on): the rows count only at a
    step where some tree beats the plain step on its drafts alone; elsewhere the step is plain.
    The rows' worth is an average over warm runs, and it is not there in a short request whose
    memory starts empty: counted everywhere, it bought 4-6-node trees in which nothing was likely
    (an AMD EPYC Zen 3, cold memory: 5.6 nodes per token against 3.1, and 1-5 points slower).
    ``RecapConfig.paper()`` is the paper's setting.

    Prompt lookup: ``pld_max_ngram`` / ``pld_min_ngram`` the n-gram sizes tried, longest
    first, and ``pld_num_tokens`` the chain length drafted.
    """

    k: int = 8
    key_orders: tuple[int, ...] = (1, 2, 3)
    fusion: str = "entropy"
    specificity: tuple[float, float, float] = (1.0, 2.0, 4.0)
    node_budget: int = 63
    max_depth: int = 10
    max_width: int = 8
    hit_masses: tuple[float, ...] = field(default=DEFAULT_HIT_MASSES)
    suffix_tokens: int = 4
    write_scope: str = "full-tree"
    persistent: bool = True
    seed_from_prefill: bool = True
    seed_context_from_prefill: bool = False
    frequency_fallback: bool = True
    persistent_context: bool = True
    scoring: str = "calibrated"
    adaptive_budget: bool = True
    adaptive_threads: bool = True
    row_value: float = 0.04
    row_value_nodes: int = 8
    row_value_needs_drafts: bool = True
    pld_max_ngram: int = 3
    pld_min_ngram: int = 1
    pld_num_tokens: int = 10

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise ValueError(f"RecapConfig.{name}={getattr(self, name)!r}: {why}")

        if not 1 <= self.k <= 64:
            fail("k", "must be between 1 and 64")
        orders = tuple(self.key_orders)
        if not orders or any(o not in (1, 2, 3) for o in orders) or len(set(orders)) != len(orders):
            fail("key_orders", "must be a non-empty set of distinct orders among 1, 2, 3")
        object.__setattr__(self, "key_orders", tuple(sorted(orders)))
        if self.fusion not in FUSION_MODES:
            fail("fusion", f"choose one of {', '.join(FUSION_MODES)}")
        if len(self.specificity) != 3 or any(not s > 0 for s in self.specificity):
            fail("specificity", "needs three positive weights, for key orders 1, 2, 3")
        object.__setattr__(self, "specificity", tuple(float(s) for s in self.specificity))
        if self.node_budget < 0:
            fail("node_budget", "must be >= 0 (0 drafts nothing)")
        if self.scoring not in SCORINGS:
            fail("scoring", f"choose one of {', '.join(SCORINGS)}")
        if self.max_depth < 1:
            fail("max_depth", "must be >= 1")
        if not 1 <= self.max_width <= self.k:
            fail("max_width", f"must be between 1 and k={self.k}")
        masses = tuple(float(m) for m in self.hit_masses)
        if not masses or any(not 0 < m <= 1 for m in masses):
            fail("hit_masses", "needs at least one value in (0, 1]")
        object.__setattr__(self, "hit_masses", masses)
        if self.suffix_tokens < 0:
            fail("suffix_tokens", "must be >= 0 (0 turns the suffix path off)")
        if not 0 <= self.row_value < 1:
            fail("row_value", "must be in [0, 1): the tokens a verified node's rows are worth in later steps")
        if self.row_value_nodes < 0:
            fail("row_value_nodes", "must be >= 0 (the drafted nodes whose rows are valued)")
        if self.write_scope not in WRITE_SCOPES:
            fail("write_scope", f"choose one of {', '.join(WRITE_SCOPES)}")
        if not 1 <= self.pld_min_ngram <= self.pld_max_ngram:
            fail("pld_min_ngram", "must satisfy 1 <= pld_min_ngram <= pld_max_ngram")
        if self.pld_num_tokens < 1:
            fail("pld_num_tokens", "must be >= 1")

    @classmethod
    def paper(cls, **changes: object) -> RecapConfig:
        """The paper's RECAP: 63 nodes every step, hit-mass scores, the 4-token suffix path
        grafted on top, request-local 2-/3-token rows only, no frequency fallback (``changes``
        override any field)."""
        settings: dict[str, object] = dict(
            node_budget=63, adaptive_budget=False, scoring="hit-mass", frequency_fallback=False,
            persistent_context=False,
        )  # fmt: skip
        return cls(**{**settings, **changes})

    def hit_mass(self, depth: int) -> float:
        """The hit mass of a node at ``depth`` (>= 1); the last value repeats deeper."""
        return self.hit_masses[min(depth, len(self.hit_masses)) - 1]

    def replace(self, **changes: object) -> RecapConfig:
        """A copy with ``changes`` applied (and validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown RecapConfig fields: {sorted(unknown)}")
        return replace(self, **changes)
