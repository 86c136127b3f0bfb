"""Memory tables: open-addressing hash tables for the 2-/3-token keys, and row writes.

A contextual key of up to three tokens is packed into one int64 (21 bits a token, so token
ids up to 2**21 - 1), hashed with splitmix64 and probed linearly. A table is six arrays:
``keys`` [cap] int64 (``EMPTY`` where free), ``ids`` [cap, k] int32, ``probs`` [cap, k]
float32, ``kappa`` [cap] float32, ``stamps`` [cap] int64, the request that wrote each row
(so one table holds a request's own rows and, under other stamps, the rows kept from earlier
requests), and ``used`` [cap] int64, the use clock when the row was last read by drafting or
written; ``cap`` is a power of two and the owner grows the table before it gets half full,
so a probe always ends. A bounded table evicts its least recently used rows
(``evict_least_used``). References: ``recap.reference.context_memory``.

A row's concentration kappa = exp(-H), H the entropy of its k probabilities plus one residual
bucket holding the mass outside them, is computed here too (``row_concentrations``).
"""

from __future__ import annotations

import numpy as np

from ..codes import EMPTY, MAX_TOKEN, TOKEN_BITS
from ..jit import njit
from .cells import count_trial


@njit
def concentration_of_row(probs: np.ndarray, i: int) -> np.float32:
    """kappa of row ``i`` of ``probs`` [N, k]: exp(-entropy) with the residual bucket."""
    entropy, total = 0.0, 0.0
    for j in range(probs.shape[1]):
        p = min(max(np.float64(probs[i, j]), 1e-30), 1.0)
        total += p
        entropy -= p * np.log(p)
    residual = min(max(1.0 - total, 1e-30), 1.0)
    entropy -= residual * np.log(residual)
    return np.float32(np.exp(-entropy))


@njit
def row_concentrations(probs: np.ndarray) -> np.ndarray:
    """kappa of every row of ``probs`` [N, k] float32. [N] float32, in (0, 1]"""
    out = np.empty(probs.shape[0], np.float32)
    for i in range(probs.shape[0]):
        out[i] = concentration_of_row(probs, i)
    return out


@njit
def pack_key(a: int, b: int, c: int) -> int:
    """The int64 of key (a, b, c), or of the 2-token key (b, c) when a < 0; EMPTY if b or c is
    invalid. 2- and 3-token keys live in separate tables, so they need not differ."""
    if b < 0 or c < 0 or b > MAX_TOKEN or c > MAX_TOKEN or a > MAX_TOKEN:
        return EMPTY
    if a < 0:
        return (b << TOKEN_BITS) | c
    return (((a << TOKEN_BITS) | b) << TOKEN_BITS) | c


@njit
def _home(key: int, mask: int) -> int:
    z = np.uint64(key) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z & np.uint64(mask))


@njit
def find(keys: np.ndarray, key: int) -> int:
    """Slot holding ``key``, or -1."""
    if key < 0:
        return -1
    mask = keys.shape[0] - 1
    slot = _home(key, mask)
    while True:
        held = keys[slot]
        if held == key:
            return slot
        if held == EMPTY:
            return -1
        slot = (slot + 1) & mask


@njit
def _claim(keys: np.ndarray, key: int) -> tuple[int, bool]:
    """(slot of ``key``, whether it was free and is now taken)."""
    mask = keys.shape[0] - 1
    slot = _home(key, mask)
    while True:
        held = keys[slot]
        if held == key:
            return slot, False
        if held == EMPTY:
            keys[slot] = key
            return slot, True
        slot = (slot + 1) & mask


@njit
def _write_row(ids, probs, kappa, slot: int, row: int, top_ids, top_probs, row_kappa) -> None:
    width = min(ids.shape[1], top_ids.shape[1])
    for c in range(width):
        ids[slot, c] = top_ids[row, c]
        probs[slot, c] = top_probs[row, c]
    for c in range(width, ids.shape[1]):
        ids[slot, c] = 0
        probs[slot, c] = 0.0
    kappa[slot] = row_kappa


@njit
def write_context_rows(
    keys: np.ndarray,  # [cap] int64
    ids: np.ndarray,  # [cap, k] int32
    probs: np.ndarray,  # [cap, k] float32
    kappa: np.ndarray,  # [cap] float32
    stamps: np.ndarray,  # [cap] int64
    used: np.ndarray,  # [cap] int64
    new_keys: np.ndarray,  # [M] int64, EMPTY to skip
    rows: np.ndarray,  # [M] int64, row of the top-k arrays written under each key
    top_ids: np.ndarray,  # [N, k'] int64
    top_probs: np.ndarray,  # [N, k'] float32
    top_kappa: np.ndarray,  # [N] float32
    stamp: int,
    now: int,  # the use clock
) -> int:
    """Write top-k rows under packed keys, stamped and used ``now``; within one call the first
    occurrence of a key wins (written last). Returns how many keys were new."""
    added = 0
    for j in range(new_keys.shape[0] - 1, -1, -1):
        key = new_keys[j]
        if key < 0:
            continue
        slot, new = _claim(keys, key)
        added += new
        _write_row(ids, probs, kappa, slot, rows[j], top_ids, top_probs, top_kappa[rows[j]])
        stamps[slot] = stamp
        used[slot] = now
    return added


@njit
def rehash(
    old_keys: np.ndarray,
    old_ids: np.ndarray,
    old_probs: np.ndarray,
    old_kappa: np.ndarray,
    old_stamps: np.ndarray,
    old_used: np.ndarray,
    keys: np.ndarray,
    ids: np.ndarray,
    probs: np.ndarray,
    kappa: np.ndarray,
    stamps: np.ndarray,
    used: np.ndarray,
) -> None:
    """Move every entry of the old arrays into the new (larger, empty) ones."""
    for old in range(old_keys.shape[0]):
        key = old_keys[old]
        if key == EMPTY:
            continue
        slot, _ = _claim(keys, key)
        ids[slot] = old_ids[old]
        probs[slot] = old_probs[old]
        kappa[slot] = old_kappa[old]
        stamps[slot] = old_stamps[old]
        used[slot] = old_used[old]


@njit
def _oldest(slots: np.ndarray, used: np.ndarray, keys: np.ndarray, drop: int, out: np.ndarray) -> None:
    """Mark in ``out`` the ``drop`` rows of ``slots`` used least recently (ties: the smaller key)."""
    if drop >= slots.shape[0]:
        for i in range(slots.shape[0]):
            out[slots[i]] = True
        return
    times = np.sort(used[slots])
    last = times[drop - 1]  # every row used before ``last`` goes, and the smallest keys of those used at it
    tied = 0
    for i in range(slots.shape[0]):
        t = used[slots[i]]
        if t < last:
            out[slots[i]] = True
            drop -= 1
        elif t == last:
            tied += 1
    tie_keys = np.empty(tied, np.int64)
    tied = 0
    for i in range(slots.shape[0]):
        if used[slots[i]] == last:
            tie_keys[tied] = keys[slots[i]]
            tied += 1
    if drop <= 0:
        return
    cut = np.sort(tie_keys)[drop - 1]
    for i in range(slots.shape[0]):
        if used[slots[i]] == last and keys[slots[i]] <= cut:
            out[slots[i]] = True


@njit
def evict_least_used(
    keys: np.ndarray,  # [cap] int64
    ids: np.ndarray,  # [cap, k] int32
    probs: np.ndarray,  # [cap, k] float32
    kappa: np.ndarray,  # [cap] float32
    stamps: np.ndarray,  # [cap] int64
    used: np.ndarray,  # [cap] int64
    protected: np.ndarray,  # [P] int64, sorted: stamps of the requests under way
    keep: int,
) -> int:
    """Keep the ``keep`` most useful rows and rebuild the table in place without the others.
    Evicted first: rows not written by a request under way, least recently used first (ties: the
    smaller packed key); then, only if that is not enough, the protected rows the same way.
    Returns the number of rows evicted. Reference: ``recap.reference.context_memory.evict_least_used``."""
    cap = keys.shape[0]
    n_free, n_held = 0, 0
    for s in range(cap):
        if keys[s] == EMPTY:
            continue
        at = np.searchsorted(protected, stamps[s])
        if at < protected.shape[0] and protected[at] == stamps[s]:
            n_held += 1
        else:
            n_free += 1
    drop = n_free + n_held - keep
    if drop <= 0:
        return 0
    free = np.empty(n_free, np.int64)
    held = np.empty(n_held, np.int64)
    n_free, n_held = 0, 0
    for s in range(cap):
        if keys[s] == EMPTY:
            continue
        at = np.searchsorted(protected, stamps[s])
        if at < protected.shape[0] and protected[at] == stamps[s]:
            held[n_held] = s
            n_held += 1
        else:
            free[n_free] = s
            n_free += 1
    out = np.zeros(cap, np.bool_)
    _oldest(free, used, keys, drop, out)
    if drop > n_free:
        _oldest(held, used, keys, drop - n_free, out)
    # the rows kept, copied out, then written back into the emptied table
    kept = n_free + n_held - drop
    k_keys = np.empty(kept, np.int64)
    k_ids = np.empty((kept, ids.shape[1]), ids.dtype)
    k_probs = np.empty((kept, probs.shape[1]), probs.dtype)
    k_kappa = np.empty(kept, kappa.dtype)
    k_stamps = np.empty(kept, np.int64)
    k_used = np.empty(kept, np.int64)
    j = 0
    for s in range(cap):
        if keys[s] == EMPTY or out[s]:
            continue
        k_keys[j], k_kappa[j], k_stamps[j], k_used[j] = keys[s], kappa[s], stamps[s], used[s]
        k_ids[j] = ids[s]
        k_probs[j] = probs[s]
        j += 1
    keys[:] = EMPTY
    for j in range(kept):
        slot, _ = _claim(keys, k_keys[j])
        ids[slot] = k_ids[j]
        probs[slot] = k_probs[j]
        kappa[slot], stamps[slot], used[slot] = k_kappa[j], k_stamps[j], k_used[j]
    return drop


@njit
def write_token_rows(
    mem_ids: np.ndarray,  # [vocab, k] int32
    mem_probs: np.ndarray,  # [vocab, k] float32
    mem_kappa: np.ndarray,  # [vocab] float32
    mem_filled: np.ndarray,  # [vocab] bool
    new_keys: np.ndarray,  # [M] int64
    rows: np.ndarray,  # [M] int64
    top_ids: np.ndarray,  # [N, k'] int64
    top_probs: np.ndarray,  # [N, k'] float32
    top_kappa: np.ndarray,  # [N] float32
) -> None:
    """The dense token memory's write: row ``rows[j]`` under token ``new_keys[j]``; keys
    outside the vocabulary are skipped; the first occurrence of a key in a call wins."""
    vocab = mem_ids.shape[0]
    for j in range(new_keys.shape[0] - 1, -1, -1):
        key = new_keys[j]
        if key < 0 or key >= vocab:
            continue
        _write_row(mem_ids, mem_probs, mem_kappa, key, rows[j], top_ids, top_probs, top_kappa[rows[j]])
        mem_filled[key] = True


@njit
def node_context_keys(
    tokens: np.ndarray,  # [N] int64, tree tokens
    parents: np.ndarray,  # [N] int64
    nodes: np.ndarray,  # [M] int64, the nodes that write
    before_root: np.ndarray,  # [2] int64: the two tokens before the root (-1 where none)
    blocked: np.ndarray,  # [vocab] bool
) -> tuple[np.ndarray, np.ndarray]:
    """Packed 2- and 3-token keys of each writing node along its own path ([M] int64 each,
    EMPTY where the key would hold a blocked or missing token)."""
    n = tokens.shape[0]
    prev1 = np.empty(n, np.int64)
    prev2 = np.empty(n, np.int64)
    prev1[0] = before_root[1]
    prev2[0] = before_root[0]
    for i in range(1, n):
        p = parents[i]
        prev1[i] = tokens[p]
        prev2[i] = prev1[p]
    vocab = blocked.shape[0]
    keys2 = np.full(nodes.shape[0], EMPTY, np.int64)
    keys3 = np.full(nodes.shape[0], EMPTY, np.int64)
    for j in range(nodes.shape[0]):
        i = nodes[j]
        t0, t1, t2 = tokens[i], prev1[i], prev2[i]
        if t1 < 0 or (t0 < vocab and blocked[t0]) or (t1 < vocab and blocked[t1]):
            continue
        keys2[j] = pack_key(-1, t1, t0)
        if t2 < 0 or (t2 < vocab and blocked[t2]):
            continue
        keys3[j] = pack_key(t2, t1, t0)
    return keys2, keys3


@njit
def learn_tree(
    tokens: np.ndarray,  # [N] int64, the verified tree
    parents: np.ndarray,  # [N] int64
    path: np.ndarray,  # [m] int64, the accepted path (root first)
    committed_only: bool,  # write the path's rows only (else every node's)
    before_root: np.ndarray,  # [2] int64, the two tokens before the root (-1 where none)
    blocked: np.ndarray,  # [vocab] bool
    token_memory,  # (ids, probs, kappa, filled)
    tables,  # (2-token table, 3-token table)
    write: np.ndarray,  # [3] bool: the token memory, the 2-token table, the 3-token table
    stamp: int,  # stamped on the rows written to the tables
    now: int,  # the use clock, set on the rows written to the tables
    top_ids: np.ndarray,  # [N, k'] int64
    top_probs: np.ndarray,  # [N, k'] float32
    cells: np.ndarray,  # [N] int64, calibration cell of each node (-1: none), or empty
    calibration,  # (trials, hits, probs, prior) [N_CELLS] float64 each; the first three updated in place
) -> np.ndarray:
    """One step's learning in one call: each writing node's top-k row under its 1-, 2- and 3-token
    keys along its own path (first occurrence wins within the step), and the calibration counts
    of the candidates verified with their parent accepted. The caller holds the locks and has
    reserved room in the tables. Returns the number of new keys per table [2]."""
    n = tokens.shape[0]
    on_path = np.zeros(n, np.bool_)
    for i in range(path.shape[0]):
        on_path[path[i]] = True
    prev1 = np.empty(n, np.int64)
    prev2 = np.empty(n, np.int64)
    prev1[0], prev2[0] = before_root[1], before_root[0]
    for i in range(1, n):
        prev1[i] = tokens[parents[i]]
        prev2[i] = prev1[parents[i]]
    vocab = blocked.shape[0]
    added = np.zeros(2, np.int64)
    for i in range(n - 1, -1, -1):  # reverse: the first occurrence of a key is written last
        if committed_only and not on_path[i]:
            continue
        t0, t1, t2 = tokens[i], prev1[i], prev2[i]
        kappa = concentration_of_row(top_probs, i)
        if write[0] and 0 <= t0 < token_memory[0].shape[0]:
            _write_row(token_memory[0], token_memory[1], token_memory[2], t0, i, top_ids, top_probs, kappa)
            token_memory[3][t0] = True
        if t1 < 0 or (t0 < vocab and blocked[t0]) or (t1 < vocab and blocked[t1]):
            continue
        key2 = pack_key(-1, t1, t0)
        key3 = EMPTY if (t2 < 0 or (t2 < vocab and blocked[t2])) else pack_key(t2, t1, t0)
        for t in range(2):
            key = key2 if t == 0 else key3
            if write[t + 1] and key >= 0:
                table = tables[t]
                slot, new = _claim(table[0], key)
                added[t] += new
                _write_row(table[1], table[2], table[3], slot, i, top_ids, top_probs, kappa)
                table[4][slot] = stamp
                table[5][slot] = now
    if cells.shape[0] == n:
        trials, hits, probs, prior = calibration
        for i in range(1, n):
            cell = cells[i]
            if cell >= 0 and on_path[parents[i]]:
                count_trial(trials, hits, probs, prior, cell, on_path[i])
    return added


def warm_up() -> None:
    row_concentrations(np.full((1, 2), 0.5, np.float32))
    table = (np.full(8, EMPTY, np.int64), np.zeros((8, 2), np.int32), np.zeros((8, 2), np.float32),
             np.zeros(8, np.float32), np.zeros(8, np.int64), np.zeros(8, np.int64))  # fmt: skip
    bigger = tuple(np.concatenate([a, a]) for a in table)
    top_ids, top_probs, top_kappa = np.zeros((1, 2), np.int64), np.zeros((1, 2), np.float32), np.zeros(1, np.float32)
    one = np.zeros(1, np.int64)
    write_context_rows(*table, one + pack_key(-1, 1, 2), one, top_ids, top_probs, top_kappa, 1, 1)
    find(table[0], pack_key(1, 2, 3))
    rehash(*table, *bigger)
    evict_least_used(*bigger, one, 0)
    write_token_rows(table[1], table[2], table[3], np.zeros(8, np.bool_), one, one, top_ids, top_probs, top_kappa)
    node_context_keys(np.zeros(2, np.int64), np.array([-1, 0]), np.arange(2), np.full(2, -1), np.zeros(8, np.bool_))
    learn_tree(
        np.zeros(2, np.int64), np.array([-1, 0]), np.arange(1), False, np.full(2, -1), np.zeros(8, np.bool_),
        (table[1], table[2], table[3], np.zeros(8, np.bool_)), (table, table), np.ones(3, np.bool_), 1, 1,
        np.zeros((2, 2), np.int64), np.zeros((2, 2), np.float32), np.zeros(2, np.int64),
        (np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3)),
    )  # fmt: skip
