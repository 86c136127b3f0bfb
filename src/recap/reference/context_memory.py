"""The reference of ``recap.core.memory.ContextTable``: 2-/3-token rows in a dict, and its eviction."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.memory import Row


class ContextMemory:
    """Rows keyed by the last ``order`` tokens (2 or 3); lives for one request."""

    def __init__(self, order: int) -> None:
        self.order = order
        self.rows: dict[tuple[int, ...], Row] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, key: tuple[int, ...]) -> Row | None:
        return self.rows.get(key)

    def write_many(self, keys: Sequence[tuple[int, ...]], rows: Sequence[Row]) -> None:
        """Write rows under keys; within one call the first occurrence of a key wins."""
        self.rows.update(zip(reversed(keys), reversed(rows)))

    def clear(self) -> None:
        self.rows.clear()


def evict_least_used(rows: dict[int, tuple[int, int]], protected: set[int], keep: int) -> set[int]:
    """The keys a bounded table evicts to keep ``keep`` rows (``recap.kernels.tables.evict_least_used``).

    ``rows``: packed key -> (stamp of the request that wrote it, use time: when drafting last read
    it or it was written). The rows of requests under way (stamps in ``protected``) go last; within
    each group the least recently used go first, ties broken by the smaller key.
    """
    order = sorted(rows, key=lambda key: (rows[key][0] in protected, rows[key][1], key))
    return set(order[: max(0, len(rows) - keep)])
