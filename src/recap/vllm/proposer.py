"""RECAP as a vLLM speculative proposer (``speculative_config={"method": "custom_class", ...}``).

vLLM 0.32 verifies one chain per request per step. Each step, for every request in the batch:

1. ``recap_tap`` (called from the wrapped ``_sample``, see ``recap.vllm.tap``) takes the top-k
   of the request's verified rows: its root (the last committed token) and each draft,
   rejected ones included.
2. ``propose`` (vLLM calls it after the step's tokens are committed) lets the request's
   ``RecapDrafter`` learn from those rows, as RECAP does from a verified tree, then drafts
   RECAP's best-first tree from the history and returns its best chain (``best_chain``):
   up to ``num_speculative_tokens`` tokens, fewer where the drafter's own estimate that the
   path is accepted falls below ``min_prob``.

State: one ``RecapDrafter`` per request (its 2-/3-token memories, suffix index, frequent
tokens), keyed by request id, so rows may move between steps; it is dropped when vLLM's runner
frees the request's state (finished or aborted: ``recap_forget``, called through ``tap``), and
each begin and end is logged at DEBUG with the number of requests live. The persistent token
memory (and its 2-/3-token rows and calibration) is one ``TokenMemory`` shared by every request
the engine serves.

Settings (environment variables, read when the engine creates the proposer, since vLLM's
speculative config takes no extra fields):
``RECAP_VLLM_MEMORY`` a memory file (``TokenMemory.save`` / ``recap memory``) to start from;
``RECAP_VLLM_SNAPSHOT`` the server's own memory file, read at start and saved every
``RECAP_VLLM_SNAPSHOT_SECONDS`` (300) and at shutdown (``recap.vllm.snapshot``);
``RECAP_VLLM_MIN_PROB`` (default 0.1) the chain's cut-off; ``RECAP_VLLM_NODES`` (default 32)
the nodes of the tree the chain is chosen from; ``RECAP_VLLM_MEMORY_SCOPE``: ``shared`` (the
default: one token memory for every request, what a server wants) or ``request`` (each request
starts from an empty memory of its own: RECAP with cold memory, for comparisons);
``RECAP_VLLM_LOG_LEVEL`` (default INFO) the level of recap's log lines, which go to stderr
where nothing else handles them (vLLM configures its own loggers only).

Tree mode (``RecapTreeProposer``, ``speculative_config(tree=N)``): each step proposes RECAP's
tree of up to ``N`` nodes (``num_speculative_tokens = N``), best chain first, and the
patches of ``recap.vllm.tree_mode`` verify it as a tree; the drafter then learns from every
verified node. ``RECAP_VLLM_TREE_DEPTH`` (default 10) bounds the tree's depth,
``RECAP_VLLM_CHAIN_K`` (default 4) the chain of requests (or engines) that fall back to it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import kernels
from ..backends.hf import placeholder_ids
from ..config import RecapConfig
from ..core.accept import Acceptance
from ..core.memory import TokenMemory
from ..core.topk import TopK
from ..core.tree import DraftTree
from ..drafters.recap import RecapDrafter
from . import tap

logger = logging.getLogger("recap.vllm")

TOPK = 8  # candidates kept per verified row (the memory's k)
DEFAULT_MIN_PROB = 0.1
DEFAULT_NODES = 32
DEFAULT_TREE_DEPTH = 10
DEFAULT_CHAIN_K = 4
_live: weakref.WeakSet[RecapProposer] = weakref.WeakSet()
_live_lock = threading.Lock()


def live_proposers() -> list[RecapProposer]:
    """The RECAP proposers alive in this process (with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the
    engine runs in the caller's process, so tests and benchmarks can read their statistics)."""
    with _live_lock:
        return list(_live)


@dataclass
class ProposerStats:
    """What the proposer saw and did, summed over the engine's life."""

    steps: int = 0  # propose calls
    requests: int = 0  # requests begun
    rows: int = 0  # verified rows learned from (the tap's rows of committed steps)
    rejected_rows: int = 0  # of those, rows of drafts the target rejected
    drafts: int = 0  # tokens proposed
    accepted: int = 0  # of the drafts verified, tokens accepted
    verified_drafts: int = 0  # drafts vLLM verified (the tap's rows minus the roots)
    inconsistent: int = 0  # rows not learned from: not the layout read, or not the committed tokens (expect 0)
    chain_lengths: dict[int, int] = field(default_factory=dict)
    # tree mode
    tree_steps: int = 0  # request-steps verified as a tree
    tree_nodes: int = 0  # draft nodes verified in those
    branched: int = 0  # of those request-steps, trees with a branch (a node off the first chain)
    off_chain_accepts: int = 0  # request-steps whose accepted path left the first chain
    off_chain_tokens: int = 0  # accepted tokens from nodes off the first chain
    kv_moves: int = 0  # K/V rows moved into place (every layer counts once)
    recomputed_rows: int = 0  # off-chain attention rows recomputed, summed over layers
    chain_requests: int = 0  # requests drafted as a chain in a tree engine (a fallback reason)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "chain_lengths": dict(sorted(self.chain_lengths.items()))}


@dataclass
class _Rows:
    """One request's verified rows of one step: tokens [m] (root first), top-k ids/probs [m, K]."""

    tokens: np.ndarray
    ids: np.ndarray
    probs: np.ndarray


def _show_logs() -> None:
    """recap's log lines on stderr where no handler takes them (a vLLM server configures its own
    loggers only), at ``RECAP_VLLM_LOG_LEVEL`` (INFO)."""
    level = os.environ.get("RECAP_VLLM_LOG_LEVEL")
    package = logging.getLogger("recap")
    if level:
        try:
            package.setLevel(level.upper())
        except ValueError:
            raise ValueError(f"RECAP_VLLM_LOG_LEVEL={level!r}: choose DEBUG, INFO, WARNING or ERROR") from None
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S"))
        package.addHandler(handler)
        if not level:
            package.setLevel(logging.INFO)


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a number") from None


class RecapProposer:
    """vLLM custom proposer: ``RecapProposer(vllm_config)``; vLLM calls ``load_model`` once and
    ``propose`` every step; the logits tap calls ``recap_tap`` just before sampling."""

    tree_mode = False  # RecapTreeProposer: trees of num_speculative_tokens nodes

    def __init__(self, vllm_config: Any, memory: TokenMemory | None = None) -> None:
        tap.install()  # refuses an unsupported vLLM before anything else
        _show_logs()
        spec = vllm_config.speculative_config
        model_config = vllm_config.model_config
        self.num_spec_tokens = self.k = int(spec.num_speculative_tokens)
        self.tree_nodes = 0  # > 0: this engine verifies trees of up to this many nodes
        self.tree_reason: str | None = None  # why it does not (then it drafts chains)
        depth = self.k
        if self.tree_mode:
            from . import tree_mode

            self.tree_nodes = self.k
            self.k = min(self.k, int(_env_float("RECAP_VLLM_CHAIN_K", DEFAULT_CHAIN_K)))
            depth = min(self.tree_nodes, int(_env_float("RECAP_VLLM_TREE_DEPTH", DEFAULT_TREE_DEPTH)))
            self.tree_reason = tree_mode.engine_fallback_reason(vllm_config)
            if self.tree_reason is None:
                tree_mode.install()
            else:
                logger.warning("recap.vllm tree mode: this engine drafts chains instead: %s", self.tree_reason)
        self.max_model_len = int(model_config.max_model_len)
        self.vocab_size = int(model_config.get_vocab_size())
        self.placeholder_ids = placeholder_ids(model_config.hf_config)
        self.min_prob = _env_float("RECAP_VLLM_MIN_PROB", DEFAULT_MIN_PROB)
        nodes = self.tree_nodes or int(_env_float("RECAP_VLLM_NODES", DEFAULT_NODES))
        self.config = RecapConfig(
            k=TOPK, node_budget=max(nodes, self.k), max_depth=max(depth, self.k), adaptive_budget=False,
            seed_from_prefill=False,
        )  # fmt: skip
        self.snapshots = None
        snapshot = os.environ.get("RECAP_VLLM_SNAPSHOT")
        if snapshot:
            from .snapshot import DEFAULT_SECONDS, Snapshots

            self.snapshots = Snapshots(snapshot, _env_float("RECAP_VLLM_SNAPSHOT_SECONDS", DEFAULT_SECONDS))
        if memory is None:
            path = os.environ.get("RECAP_VLLM_MEMORY")
            if path:
                memory = TokenMemory.load(path)  # a file the user names: a bad one is an error
            elif self.snapshots is not None:
                memory = self.snapshots.open(self.vocab_size, TOPK)  # the server's own: a bad one starts cold
            else:
                memory = TokenMemory(self.vocab_size, k=TOPK, method="recap")
        if memory.vocab_size != self.vocab_size or memory.k < TOPK or memory.method != "recap":
            raise ValueError(
                f"the RECAP memory covers {memory.vocab_size} tokens with k={memory.k} ({memory.method}); this "
                f"model has {self.vocab_size} tokens and RECAP in vLLM needs k >= {TOPK}, method 'recap'"
            )
        self.memory = memory
        self.memory_scope = os.environ.get("RECAP_VLLM_MEMORY_SCOPE") or "shared"
        if self.memory_scope not in ("shared", "request"):
            raise ValueError(f"RECAP_VLLM_MEMORY_SCOPE={self.memory_scope!r}: choose shared or request")
        if self.snapshots is not None and self.memory_scope == "shared":
            self.snapshots.save_at_shutdown(self, memory)
            if multiprocessing.parent_process() is not None and not getattr(vllm_config, "shutdown_timeout", 0):
                logger.warning(
                    "recap.vllm snapshot: this engine runs in a child process and vLLM's shutdown_timeout is 0: "
                    "`vllm serve` kills that process right after its stop signal, before the save at shutdown; "
                    "start the server with --shutdown-timeout 10 (or more), else a stop keeps the last periodic "
                    "snapshot (every %.0f s)", self.snapshots.seconds,
                )  # fmt: skip
        self.stats = ProposerStats()
        ready = kernels.ensure_ready()  # at engine start, not in the middle of a request
        logger.info("RECAP drafting kernels ready in %.1f s (numba: compiled once per machine, cached)", ready)
        self._drafters: dict[str, RecapDrafter] = {}
        self._rows: dict[str, _Rows] = {}  # this step's tapped rows, by request id
        self._req_ids: list[str] = []  # this step's batch order
        self._live: Any = ()  # the runner's live requests (their sampling parameters)
        self._trees: dict[str, DraftTree] = {}  # tree mode: the tree last proposed, by request id
        self._verified: dict[str, tuple[DraftTree, list[int]]] = {}  # this step's verified trees and paths
        self._chain_only: dict[str, str | None] = {}  # per request: why it is drafted as a chain (None: a tree)
        with _live_lock:
            _live.add(self)
        logger.info(
            "RECAP proposer: up to %d tokens per step, min_prob %.2f, %d-node trees, %s memory %s%s",
            self.k, self.min_prob, self.config.node_budget, self.memory_scope, memory,
            "" if not self.trees_on else f"; tree mode: {self.tree_nodes} nodes verified per step, depth <= "
            f"{self.config.max_depth}",
        )  # fmt: skip

    @property
    def trees_on(self) -> bool:
        """Whether this engine verifies trees now."""
        return bool(self.tree_nodes) and self.tree_reason is None

    def disable_trees(self, reason: str) -> None:
        """Draft chains from now on (a step found something tree mode cannot serve)."""
        if self.tree_reason is None:
            self.tree_reason = reason
            self._trees.clear()
            logger.warning("recap.vllm tree mode: this engine drafts chains from now on: %s", reason)

    # -- tree mode: the runner patches' side of the proposer --------------------------
    def tree_for(self, req_id: str) -> DraftTree | None:
        """The tree last proposed for ``req_id`` (its nodes in the order of the drafts)."""
        return self._trees.get(req_id) if self.trees_on else None

    def verified(self, req_id: str, tree: DraftTree, path: list[int], argmax: np.ndarray) -> None:
        """The tree verified for ``req_id`` this step and its accepted path (root first)."""
        self._verified[req_id] = (tree, path)
        stats = self.stats
        stats.tree_steps += 1
        stats.tree_nodes += len(tree) - 1
        chain = tree.parents == np.arange(-1, len(tree) - 1)
        stats.branched += int(not chain.all())
        off = [node for node in path[1:] if not chain[: node + 1].all()]
        stats.off_chain_accepts += int(bool(off))
        stats.off_chain_tokens += len(off)

    def tree_stats(self, step: Any, moves: list[tuple[int, int]]) -> None:
        self.stats.kv_moves += len(moves)
        self.stats.recomputed_rows += step.computed_rows

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: RECAP drafts from the target's own predictions."""

    # -- the tap: the verified rows of this step ----------------------------------------
    def recap_tap(self, runner: Any, logits: Any, metadata: Any) -> None:
        """Keep the top-k of every row of ``logits`` [rows, vocab] by request (see ``tap``)."""
        import torch

        batch = runner.input_batch
        num_reqs = batch.num_reqs
        self._req_ids = list(batch.req_ids[:num_reqs])
        self._live = runner.requests
        # vLLM does not call the proposer, and gives every request of the batch num_speculative_tokens zeros as its
        # drafts, once the batch's longest sequence plus num_speculative_tokens passes the drafter's max_model_len
        # (a draft model's positions must fit). RECAP runs no model and stops its drafts at max_model_len itself.
        limit = self.max_model_len + self.num_spec_tokens
        if getattr(runner, "effective_drafter_max_model_len", limit) < limit:
            runner.effective_drafter_max_model_len = limit
        with torch.inference_mode():
            probs, ids = torch.softmax(logits.float(), dim=-1).topk(TOPK, dim=-1)  # [rows, K]
            probs, ids = probs.cpu().numpy(), ids.cpu().numpy()
            drafts = None if metadata is None else metadata.draft_token_ids.cpu().numpy()
        roots = batch.token_ids_cpu[np.arange(num_reqs), batch.num_tokens_no_spec[:num_reqs] - 1]
        counts = [0] * num_reqs if metadata is None else metadata.num_draft_tokens
        rows, taken = self._rows, 0
        rows.clear()
        for i, req_id in enumerate(self._req_ids):
            n = counts[i]
            tokens = np.empty(n + 1, dtype=np.int64)
            tokens[0] = roots[i]
            if n:
                tokens[1:] = drafts[taken - i : taken - i + n]
            rows[req_id] = _Rows(tokens, ids[taken : taken + n + 1], probs[taken : taken + n + 1])
            taken += n + 1
        if taken != probs.shape[0]:  # not the layout recap reads: learn nothing this step (output is unaffected)
            rows.clear()
            self.stats.inconsistent += 1
            logger.error(
                "recap.vllm tap: %d logits rows where the batch has %d; this step is not learned from. Please report "
                "it with your vLLM version.", probs.shape[0], taken,
            )  # fmt: skip

    # -- vLLM's proposer call ------------------------------------------------------------
    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Learn from this step's rows, then draft: 0..k tokens per batch row."""
        self.stats.steps += 1
        if self.snapshots is not None and self.memory_scope == "shared":
            self.snapshots.maybe_save(self.memory)
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            req_id = self._req_ids[i] if i < len(self._req_ids) else None
            rows = self._rows.pop(req_id, None)
            if not sampled or req_id is None:  # a partial prefill: nothing committed yet
                out.append([])
                continue
            length = int(num_tokens_no_spec[i])
            history = token_ids_cpu[i, :length]
            drafter = self._drafters.get(req_id)
            if drafter is None:
                drafter = self._begin(req_id, history[: length - len(sampled)])
            verified = self._verified.pop(req_id, None)
            if rows is not None and verified is not None:
                self._learn_tree(drafter, rows, verified, sampled, history[: length - len(sampled)])
            elif rows is not None:
                self._learn(drafter, rows, sampled, history[: length - len(sampled)])
            room = self.max_model_len - length - 1
            self._trees.pop(req_id, None)
            if room <= 0:
                out.append([])
            elif self.trees_on and self._tree_request(req_id):
                out.append(self._draft_tree(req_id, drafter, history, min(self.tree_nodes, room)))
            else:
                out.append(self._draft(drafter, history, min(self.k, room)))
        self._rows.clear()
        self._verified.clear()
        return out

    def recap_forget(self, req_id: str) -> None:
        """vLLM's runner freed ``req_id``'s state (finished or aborted, see ``tap``): free RECAP's."""
        drafter = self._drafters.pop(req_id, None)
        self._chain_only.pop(req_id, None)
        self._trees.pop(req_id, None)
        if drafter is not None:
            drafter.end()
            logger.debug("recap.vllm: request %s ended; %d requests live", req_id, len(self._drafters))

    def _tree_request(self, req_id: str) -> bool:
        """Whether ``req_id`` is drafted as a tree (else: one log line saying why not, once)."""
        if req_id not in self._chain_only:
            from .tree_mode import request_fallback_reason

            state = self._live.get(req_id) if hasattr(self._live, "get") else None
            why = request_fallback_reason(getattr(state, "sampling_params", None))
            self._chain_only[req_id] = why
            if why is not None:
                self.stats.chain_requests += 1
                logger.warning("recap.vllm tree mode: request %s is drafted as a chain: %s", req_id, why)
        return self._chain_only[req_id] is None

    def _draft_tree(self, req_id: str, drafter: RecapDrafter, history: np.ndarray, max_nodes: int) -> list[int]:
        tree = drafter.chain_first(drafter.propose(history), max_nodes)
        if len(tree) > 1:
            self._trees[req_id] = tree
        drafts = tree.tokens[1:].tolist()
        self.stats.drafts += len(drafts)
        return drafts

    def _learn_tree(
        self, drafter: RecapDrafter, rows: _Rows, verified: tuple[DraftTree, list[int]], sampled, before
    ) -> None:
        """RECAP's update from a verified tree: every node's row, the accepted ``path``."""
        tree, path = verified
        m = len(rows.tokens)
        if (
            m != len(tree)
            or rows.tokens[0] != before[-1]
            or list(tree.tokens[path[1:]]) != list(sampled[:-1])
            or list(rows.tokens[1:]) != list(tree.tokens[1:])
        ):
            self.stats.inconsistent += 1
            logger.warning("recap.vllm: a step's verified tree does not match its committed tokens; not learned from")
            return
        tree = DraftTree(tokens=rows.tokens, parents=tree.parents, depths=tree.depths, sources=tree.sources)
        acceptance = Acceptance(path=list(path), bonus=int(sampled[-1]))
        drafter.observe(tree, TopK(rows.ids, rows.probs), acceptance, [int(t) for t in sampled])
        accepted = len(path) - 1
        self.stats.rows += m
        self.stats.rejected_rows += m - 1 - accepted
        self.stats.verified_drafts += m - 1
        self.stats.accepted += accepted

    def _begin(self, req_id: str, prompt: np.ndarray) -> RecapDrafter:
        memory = self.memory if self.memory_scope == "shared" else TokenMemory(self.vocab_size, k=TOPK)
        drafter = RecapDrafter(self.config, memory, self.placeholder_ids)
        drafter.begin(prompt.tolist(), [], None)
        self._drafters[req_id] = drafter
        self.stats.requests += 1
        logger.debug("recap.vllm: request %s began; %d requests live", req_id, len(self._drafters))
        return drafter

    def _learn(self, drafter: RecapDrafter, rows: _Rows, sampled: Sequence[int], before: np.ndarray) -> None:
        """RECAP's update from the verified chain: ``sampled`` = accepted drafts + the bonus;
        ``before`` the request's tokens before them (the chain's root last)."""
        m = len(rows.tokens)
        negative = np.nonzero(rows.tokens < 0)[0]  # vLLM's -1 placeholder drafts: nothing to learn there
        if len(negative):
            m = int(negative[0])
            rows = _Rows(rows.tokens[:m], rows.ids[:m], rows.probs[:m])
        accepted = len(sampled) - 1
        if m == 0 or (
            rows.tokens[0] != before[-1]
            or accepted >= m
            or list(rows.tokens[1 : 1 + accepted]) != list(sampled[:accepted])
        ):
            self.stats.inconsistent += 1
            logger.warning("recap.vllm: a step's verified rows do not match its committed tokens; not learned from")
            return
        chain = DraftTree(
            tokens=rows.tokens,
            parents=np.arange(-1, m - 1, dtype=np.int64),
            depths=np.arange(m, dtype=np.int64),
            sources=np.zeros(m, dtype=np.int8),
        )
        acceptance = Acceptance(path=list(range(accepted + 1)), bonus=int(sampled[-1]))
        drafter.observe(chain, TopK(rows.ids, rows.probs), acceptance, [int(t) for t in sampled])
        self.stats.rows += m
        self.stats.rejected_rows += m - 1 - accepted
        self.stats.verified_drafts += m - 1
        self.stats.accepted += accepted

    def _draft(self, drafter: RecapDrafter, history: np.ndarray, max_tokens: int) -> list[int]:
        tree = drafter.propose(history)
        chain = drafter.best_chain(tree, max_tokens, self.min_prob)
        drafts = chain.tokens[1:].tolist()
        self.stats.drafts += len(drafts)
        self.stats.chain_lengths[len(drafts)] = self.stats.chain_lengths.get(len(drafts), 0) + 1
        return drafts


class RecapTreeProposer(RecapProposer):
    """RECAP in vLLM's tree mode: ``num_speculative_tokens`` is the tree's node count; see
    ``recap.vllm.tree_mode`` for the patches that verify it."""

    tree_mode = True
