"""Drafting methods behind one protocol, and the factory that makes them by name."""

from __future__ import annotations

from ..codes import PERSISTENT_METHODS
from ..config import RecapConfig
from ..core.memory import TokenMemory
from ..core.step_cost import StepCost
from .base import Drafter, NoDrafter
from .prompt_lookup import PromptLookupDrafter
from .recap import RecapDrafter
from .token_recycling import TokenRecyclingDrafter

METHODS = ("recap", "token_recycling", "pld", "ar")  # every method the loop runs; PERSISTENT_METHODS keep a memory


def memory_k(method: str, config: RecapConfig) -> int:
    """Candidates per row of ``method``'s persistent memory (Token Recycling's table keeps 8)."""
    return config.k if method == "recap" else 8


def make_drafter(
    method: str,
    config: RecapConfig,
    memory: TokenMemory | None,
    placeholder_ids: frozenset[int],
    cost: StepCost | None = None,
) -> Drafter:
    """The drafter of ``method``; ``memory`` is its persistent table (recap, token_recycling);
    ``placeholder_ids`` the image / video tokens never drafted; ``cost`` the step-time model RECAP
    sizes its trees with (adaptive budget)."""
    if method == "recap":
        assert memory is not None
        return RecapDrafter(config, memory, placeholder_ids, cost)
    if method == "token_recycling":
        assert memory is not None
        return TokenRecyclingDrafter(memory)
    if method == "pld":
        return PromptLookupDrafter(config.pld_max_ngram, config.pld_min_ngram, config.pld_num_tokens, placeholder_ids)
    if method == "ar":
        return NoDrafter()
    raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")


__all__ = [
    "METHODS",
    "PERSISTENT_METHODS",
    "Drafter",
    "NoDrafter",
    "PromptLookupDrafter",
    "RecapDrafter",
    "TokenRecyclingDrafter",
    "make_drafter",
    "memory_k",
]
