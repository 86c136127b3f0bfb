"""A vLLM server that keeps what it learned: the engine's shared RECAP memory saved to one file
(``RECAP_VLLM_SNAPSHOT``) now and then and when the process exits, and read back when the next
engine starts.

- At start: the file, if it exists and is a valid RECAP memory for this model's vocabulary; a
  damaged or mismatched file is renamed to ``<file>.bad`` with one warning and the engine starts
  cold (it never fails to start because of it).
- While serving: at most every ``RECAP_VLLM_SNAPSHOT_SECONDS`` (default 300), from the step that
  passes the mark, in a background thread (the snapshot of the arrays is taken under the memory's
  lock; the write is atomic: a crash leaves the previous file).
- At shutdown: once more when the engine is freed or the Python process ends normally, whichever
  comes first (``weakref.finalize`` on the proposer); a killed process keeps its last periodic
  snapshot. ``vllm serve`` kills its engine process right after its stop signal unless it was
  started with ``--shutdown-timeout N`` (N > 0): a server's exit save needs that.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from pathlib import Path

from ..core.memory import TokenMemory
from ..memory_cache import open_or_fresh

logger = logging.getLogger("recap.vllm")

DEFAULT_SECONDS = 300.0


class Snapshots:
    """The snapshot file of one engine's shared memory."""

    def __init__(self, path: str | os.PathLike, seconds: float = DEFAULT_SECONDS) -> None:
        if not seconds >= 0:
            raise ValueError(f"RECAP_VLLM_SNAPSHOT_SECONDS={seconds!r}: the seconds between snapshots, >= 0")
        self.path = Path(path).expanduser()
        self.seconds = float(seconds)
        self.saves = 0  # snapshots written
        self._last = time.monotonic()
        self._writing = threading.Lock()
        self._thread: threading.Thread | None = None
        self._final: weakref.finalize | None = None

    def open(self, vocab_size: int, k: int) -> TokenMemory:
        """The memory to serve with: the file's, or a fresh one (see the module docstring)."""
        fresh = TokenMemory(vocab_size, k=k, method="recap")
        memory = open_or_fresh(self.path, fresh, warn=lambda line: logger.warning("recap.vllm snapshot: %s", line))
        if memory is not fresh:
            logger.info("recap.vllm snapshot: started from %s (%d rows)", self.path, memory.rows_filled)
        return memory

    def save_at_shutdown(self, owner: object, memory: TokenMemory) -> None:
        """Save ``memory`` once more when ``owner`` (the proposer) is freed or the process exits
        normally, whichever comes first (the finalizer holds the memory, not the owner)."""
        self._final = weakref.finalize(owner, self._last_save, memory)

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.seconds

    def maybe_save(self, memory: TokenMemory) -> None:
        """Called every step: a snapshot in the background once ``seconds`` have passed."""
        if not self.due() or (self._thread is not None and self._thread.is_alive()):
            return
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self.save, args=(memory,), name="recap-snapshot", daemon=True)
        self._thread.start()

    def save(self, memory: TokenMemory) -> None:
        """Write the snapshot now (atomic); a failure is logged, never raised into the engine."""
        with self._writing:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                memory.save(self.path)
                self.saves += 1
            except (OSError, ValueError) as exc:
                logger.warning("recap.vllm snapshot: could not save %s: %s", self.path, exc)

    def _last_save(self, memory: TokenMemory) -> None:
        if self._thread is not None:
            self._thread.join(timeout=30)
        saves = self.saves
        self.save(memory)
        if self.saves > saves:
            logger.info("recap.vllm snapshot: saved %s at shutdown (%d rows)", self.path, memory.rows_filled)
