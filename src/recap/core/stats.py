"""Per-call statistics of speculative decoding."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from .tree import DraftTree, Source

_SOURCE_NAMES = {int(s): s.name.lower() for s in Source}


@dataclass
class DecodeStats:
    """What one ``generate`` call did.

    A step is one target forward over a draft tree (the prefill is not a step); its
    accepted length is the number of tokens it committed (accepted drafts + the bonus),
    so ``1 + sum(accepted_lengths) == new_tokens`` whenever any token was generated.
    Times are seconds.
    """

    method: str
    new_tokens: int = 0
    steps: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    nodes_verified: int = 0
    expected_tokens: float = 0.0  # what the drafter expected its trees to commit (if it estimates)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    steps_by_threads: dict[int, int] = field(default_factory=dict)  # torch threads -> steps, where the loop chose them
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_update: float = 0.0
    time_total: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens committed per step (1.0 for plain decoding; 0.0 with no step)."""
        return sum(self.accepted_lengths) / self.steps if self.steps else 0.0

    @property
    def histogram(self) -> dict[int, int]:
        """Accepted length -> number of steps."""
        return dict(sorted(Counter(self.accepted_lengths).items()))

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / (self.steps + 1)

    @property
    def nodes_per_token(self) -> float:
        return self.nodes_verified / self.new_tokens if self.new_tokens else 0.0

    @property
    def host_overhead_per_step(self) -> float:
        """Seconds of drafting and updating per step (host-side work besides the forward)."""
        return (self.time_draft + self.time_update) / self.steps if self.steps else 0.0

    def record_step(self, tree: DraftTree, committed: int) -> None:
        """One step: the tree verified and the tokens it committed."""
        n = len(tree)
        self.steps += 1
        self.nodes_verified += n
        self.tree_sizes.append(n)
        self.accepted_lengths.append(committed)
        if tree.probs is not None:  # a Python sum: numpy's reduction costs ~40 us in the decode loop
            self.expected_tokens += sum(tree.probs.tolist())

    @property
    def size_histogram(self) -> dict[int, int]:
        """Tree size (nodes, root included; 1 = a plain step) -> number of steps."""
        return dict(sorted(Counter(self.tree_sizes).items()))

    def count_sources(self, sources: list[int]) -> None:
        for s in sources:
            name = _SOURCE_NAMES[s]
            self.accepted_by_source[name] = self.accepted_by_source.get(name, 0) + 1

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            mean_accepted_length=self.mean_accepted_length,
            histogram={str(k): v for k, v in self.histogram.items()},
            size_histogram={str(k): v for k, v in self.size_histogram.items()},
            steps_by_threads={str(k): v for k, v in sorted(self.steps_by_threads.items())},
            tokens_per_forward=self.tokens_per_forward,
            nodes_per_token=self.nodes_per_token,
            host_overhead_per_step=self.host_overhead_per_step,
        )
        return out

    def summary(self) -> str:
        """One line for the terminal."""
        ms = 1000.0
        sizes = ""
        if self.steps:
            low, high, mean = min(self.tree_sizes), max(self.tree_sizes), self.nodes_verified / self.steps
            sizes = f", trees of {low}-{high} nodes (mean {mean:.1f})"
            if self.expected_tokens:
                sizes += f", expected {self.expected_tokens / self.steps:.2f} tokens/step"
        return (
            f"{self.method}: {self.new_tokens} tokens in {self.steps} steps, "
            f"mean accepted length {self.mean_accepted_length:.2f}{sizes}, "
            f"{self.nodes_per_token:.1f} nodes/token, {self.time_total * ms:.0f} ms "
            f"(prefill {self.time_prefill * ms:.0f}, draft {self.time_draft * ms:.0f}, "
            f"verify {self.time_verify * ms:.0f}, update {self.time_update * ms:.0f})"
        )
