"""The one drafter protocol that every method implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..core.accept import Acceptance
from ..core.topk import TopK
from ..core.tree import DraftTree


class Drafter(Protocol):
    """Proposes a draft tree each step and learns from what the target verified.

    Call order per request: ``prefill_positions`` -> ``begin`` -> (``propose`` ->
    ``observe``)* -> ``end``. ``history`` is the request's tokens so far (prompt and
    generated), its last token the root of the next tree.
    """

    name: str

    def prefill_positions(self, prompt_ids: Sequence[int]) -> list[int]:
        """Prompt positions whose top-k the drafter wants from the prefill ([] for none)."""
        ...

    def begin(self, prompt_ids: Sequence[int], positions: Sequence[int], prompt_topk: TopK | None) -> None: ...

    def propose(self, history: Sequence[int]) -> DraftTree: ...

    def observe(self, tree: DraftTree, topk: TopK, acceptance: Acceptance, committed: Sequence[int]) -> None:
        """``topk`` [N, k] of every tree node; ``committed`` the tokens this step added."""
        ...

    def end(self) -> None: ...


class NoDrafter:
    """Plain decoding through the speculative loop: the tree is the root alone."""

    name = "ar"

    def prefill_positions(self, prompt_ids: Sequence[int]) -> list[int]:
        return []

    def begin(self, prompt_ids: Sequence[int], positions: Sequence[int], prompt_topk: TopK | None) -> None:
        pass

    def propose(self, history: Sequence[int]) -> DraftTree:
        return DraftTree.root_only(history[-1])

    def observe(self, tree: DraftTree, topk: TopK, acceptance: Acceptance, committed: Sequence[int]) -> None:
        pass

    def end(self) -> None:
        pass
