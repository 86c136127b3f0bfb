"""Token memories on disk: one safetensors file, written atomically, validated on read.

File layout (format ``recap-memory``, version 2): tensors ``ids`` [vocab, k] int32,
``probs`` [vocab, k] float32, ``kappa`` [vocab] float32 and ``filled`` [vocab] uint8 (0/1),
the drafter's calibration counts ``calibration_trials`` / ``calibration_accepted``
[N_CELLS] float64 (``recap.core.calibration``), and the persistent 2-/3-token rows: for o in 2, 3,
``context{o}_keys`` [m_o] int64 (packed keys, ``recap.kernels.tables.pack_key``),
``context{o}_ids`` [m_o, k] int32, ``context{o}_probs`` [m_o, k] float32, ``context{o}_kappa``
[m_o] float32, m_o given by the header's ``context{o}_rows`` (version 1 files, without the
calibration and the 2-/3-token rows, still load);
the safetensors metadata key ``recap`` holds a JSON header with ``format``,
``format_version``, ``method``, ``k``, ``vocab_size``, ``fingerprint``, ``rows_filled``,
``created`` (ISO 8601, UTC) and ``recap_version``, and (optional, written by memories with a
budget) ``max_context_rows``, the memory's budget of kept 2-/3-token rows. The kept rows are
stored least recently used first, so their order is their recency. Nothing is ever unpickled.

This module knows the file; ``TokenMemory.save`` / ``TokenMemory.load`` (``recap.core.memory``)
turn a memory into its tensors and back.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import stat
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from ..codes import MIN_CONTEXT_ROWS, N_CELLS, PERSISTENT_METHODS, TOKEN_BITS
from ..errors import MemoryFileError
from ..version import __version__
from .vocab import output_vocab_size

FORMAT_NAME = "recap-memory"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
METADATA_KEY = "recap"
TENSORS_V1 = ("ids", "probs", "kappa", "filled")
CONTEXT_TENSORS = tuple(f"context{o}_{part}" for o in (2, 3) for part in ("keys", "ids", "probs", "kappa"))
TENSORS = TENSORS_V1 + ("calibration_trials", "calibration_accepted") + CONTEXT_TENSORS
# safetensors dtype names of each tensor and the numpy dtype they load as
_DTYPES = {
    "ids": ("I32", np.int32),
    "probs": ("F32", np.float32),
    "kappa": ("F32", np.float32),
    "filled": ("U8", np.uint8),
    "calibration_trials": ("F64", np.float64),
    "calibration_accepted": ("F64", np.float64),
    **{f"context{o}_keys": ("I64", np.int64) for o in (2, 3)},
    **{f"context{o}_ids": ("I32", np.int32) for o in (2, 3)},
    **{f"context{o}_probs": ("F32", np.float32) for o in (2, 3)},
    **{f"context{o}_kappa": ("F32", np.float32) for o in (2, 3)},
}
_HEADER_INTS_V2 = ("context2_rows", "context3_rows")
_HEADER_INTS = ("format_version", "k", "vocab_size", "rows_filled")
_HEADER_STRS = ("format", "method", "fingerprint", "created", "recap_version")

PathLike = str | os.PathLike


class _Invalid(Exception):
    """A problem with a file's content; becomes a ``MemoryFileError`` naming the file."""


def cache_dir() -> Path:
    """recap's folder in the user's cache: ``$RECAP_CACHE``, else ``~/.cache/recap`` (memory files
    under ``memory/``, vLLM exports under ``vllm/``). Not created here."""
    return Path(os.environ.get("RECAP_CACHE") or Path.home() / ".cache" / "recap")


# -- fingerprints ---------------------------------------------------------------------------
def _tokenizer_of(obj: Any) -> Any:
    """The tokenizer of a processor, ``obj`` itself if it is a tokenizer, else None."""
    inner = getattr(obj, "tokenizer", None)
    if inner is not None and hasattr(inner, "get_vocab"):
        return inner
    return obj if hasattr(obj, "get_vocab") else None


def tokenizer_fingerprint(obj: Any) -> str:
    """sha256 hex digest identifying a vocabulary, stable across processes.

    ``obj`` is a transformers tokenizer, a processor (its ``.tokenizer`` is used) or a model.
    For a tokenizer the digest covers every (token, id) pair of its vocabulary, added and
    special tokens included, sorted by id. A model carries no tokenizer, so for a model the
    digest falls back to (``model_type``, output vocabulary size): it tells models of
    different vocabulary sizes apart but not two tokenizers of the same size.
    """
    tokenizer = _tokenizer_of(obj)
    if tokenizer is not None:
        pairs = {str(token): int(index) for token, index in tokenizer.get_vocab().items()}
        for index, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            pairs[str(getattr(added, "content", added))] = int(index)
        items = sorted(pairs.items(), key=lambda item: (item[1], item[0]))
        payload = json.dumps({"kind": "tokenizer-vocab", "pairs": items}, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()
    if hasattr(obj, "get_output_embeddings"):
        model_type = getattr(getattr(obj, "config", None), "model_type", None)
        payload = json.dumps({"kind": "model", "model_type": model_type, "vocab": output_vocab_size(obj)})
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()
    raise TypeError(f"tokenizer_fingerprint needs a tokenizer, processor or model, got {type(obj).__name__}")


# -- saving ---------------------------------------------------------------------------------
def header_for(
    method: str, k: int, vocab_size: int, fingerprint: str, tensors: dict[str, np.ndarray]
) -> dict[str, Any]:
    """The JSON header of a file holding ``tensors`` (``TokenMemory.snapshot``'s arrays)."""
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "method": method,
        "k": int(k),
        "vocab_size": int(vocab_size),
        "fingerprint": str(fingerprint or ""),
        "rows_filled": int(tensors["filled"].sum()),
        "context2_rows": int(len(tensors["context2_keys"])),
        "context3_rows": int(len(tensors["context3_keys"])),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "recap_version": __version__,
    }


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file(path: PathLike, tensors: dict[str, np.ndarray], header: dict[str, Any]) -> None:
    """Write a memory's ``tensors`` and ``header`` to ``path`` atomically.

    (``TokenMemory.save`` takes a consistent snapshot under the memory's lock, so other threads
    may keep decoding, and calls this.) It is written to a temporary file in the same folder,
    flushed and fsynced, renamed onto ``path`` and the folder fsynced. A crash or kill at any
    point leaves the previous file intact; an interrupted save may leave a hidden ``.<name>.*.tmp`` file behind, never a
    partial ``path``. A memory that would not pass ``load_memory``'s checks is refused
    with ``ValueError``. An existing file's permissions are kept; a new file gets 0o644.
    """
    path = os.fspath(path)
    try:
        _check_content(header, tensors)
    except _Invalid as e:
        raise ValueError(f"refusing to save the memory to {path}: {e}") from None
    write_atomic(path, safetensors.numpy.save(tensors, metadata={METADATA_KEY: json.dumps(header, sort_keys=True)}))


def write_atomic(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: to a temporary file in the same folder, flushed and
    fsynced, renamed onto ``path``, the folder fsynced. A crash at any point leaves the previous file
    intact (at worst a hidden ``.<name>.*.tmp`` file behind). An existing file's permissions are
    kept; a new file gets 0o644."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)


# -- loading --------------------------------------------------------------------------------
def _read(path: str) -> bytes:
    """The file's bytes, read through one descriptor (no mmap: a file changed underneath
    cannot crash the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise _Invalid("does not exist") from None
    except IsADirectoryError:
        raise _Invalid("is not a regular file (a directory)") from None
    except OSError as e:
        raise _Invalid(f"cannot be opened ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Invalid("is not a regular file")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 24)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise _Invalid(f"cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)


def _parse(data: bytes) -> tuple[dict[str, Any], dict[str, tuple[str, list[int], bytes]]]:
    """(recap header, {name: (dtype, shape, bytes)}) of a safetensors file's bytes."""
    try:
        entries = safetensors.deserialize(data)
        (header_len,) = struct.unpack("<Q", data[:8])
        raw = json.loads(data[8 : 8 + header_len].decode("utf-8"))
        metadata = raw.get("__metadata__") if isinstance(raw, dict) else None
        tensors = {str(name): (str(v["dtype"]), [int(s) for s in v["shape"]], v["data"]) for name, v in entries}
    except Exception as e:
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise _Invalid(f"is not a valid safetensors file (truncated or corrupted: {detail})") from None
    if not isinstance(metadata, dict) or METADATA_KEY not in metadata:
        raise _Invalid(f"has no recap header (safetensors metadata key {METADATA_KEY!r}); was it written by recap?")
    try:
        header = json.loads(metadata[METADATA_KEY])
    except (TypeError, ValueError) as e:
        raise _Invalid(f"has a malformed recap header (not JSON: {e})") from None
    if not isinstance(header, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(header), "null")
        raise _Invalid(f"has a malformed recap header (a JSON {kind}, expected an object)")
    return header, tensors


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_header(header: dict[str, Any]) -> None:
    if header.get("format") != FORMAT_NAME:
        raise _Invalid(f"is not a recap memory file (format {_short(header.get('format'))}, expected {FORMAT_NAME!r})")
    for name in _HEADER_INTS + _HEADER_STRS:
        if name not in header:
            raise _Invalid(f"has a malformed recap header (field {name!r} is missing)")
    version = header["format_version"]
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise _Invalid(
            f"has unsupported format version {_short(version)}; this recap reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))} (upgrade recap, or re-create the memory)"
        )
    if version >= 2:
        for name in _HEADER_INTS_V2:
            if name not in header:
                raise _Invalid(f"has a malformed recap header (field {name!r} is missing)")
    for name in _HEADER_INTS + (_HEADER_INTS_V2 if version >= 2 else ()):
        value = header[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _Invalid(f"has a malformed recap header ({name!r} must be an integer >= 0, got {_short(value)})")
    for name in _HEADER_STRS:
        if not isinstance(header[name], str):
            raise _Invalid(f"has a malformed recap header ({name!r} must be a string, got {_short(header[name])})")
    if header["method"] not in PERSISTENT_METHODS:
        methods = ", ".join(PERSISTENT_METHODS)
        raise _Invalid(f"has unknown method {_short(header['method'])} (expected one of {methods})")
    if header["k"] < 1 or header["vocab_size"] < 1:
        raise _Invalid(f"has a malformed recap header (k={header['k']}, vocab_size={header['vocab_size']}; need >= 1)")
    budget = header.get("max_context_rows", MIN_CONTEXT_ROWS)  # optional: files of older recaps have none
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_CONTEXT_ROWS:
        raise _Invalid(
            f"has a malformed recap header ('max_context_rows' must be an integer >= {MIN_CONTEXT_ROWS}, "
            f"got {_short(budget)})"
        )


def _check_tensors(header: dict[str, Any], raw: dict[str, tuple[str, list[int], bytes]]) -> dict[str, np.ndarray]:
    """Names, dtypes and shapes against the header; returns the arrays (read-only views)."""
    names = TENSORS if header["format_version"] >= 2 else TENSORS_V1
    missing = [name for name in names if name not in raw]
    if missing:
        raise _Invalid(f"is missing tensor(s) {', '.join(missing)}")
    extra = sorted(set(raw) - set(names))
    if extra:
        raise _Invalid(f"has unexpected tensor(s) {', '.join(extra[:5])}")
    expected_shapes = _shapes(header)
    arrays = {}
    for name in names:
        dtype, shape, data = raw[name]
        want_dtype, np_dtype = _DTYPES[name]
        if dtype != want_dtype:
            raise _Invalid(f"tensor {name!r} has dtype {dtype}, expected {want_dtype}")
        if shape != expected_shapes[name]:
            raise _Invalid(
                f"tensor {name!r} has shape {shape}, expected {expected_shapes[name]} "
                f"(header vocab_size={header['vocab_size']}, k={header['k']}): header and tensors are inconsistent"
            )
        arrays[name] = np.frombuffer(data, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(shape)
    return arrays


def _shapes(header: dict[str, Any]) -> dict[str, list[int]]:
    vocab, k = header["vocab_size"], header["k"]
    shapes = {"ids": [vocab, k], "probs": [vocab, k], "kappa": [vocab], "filled": [vocab]}
    if header["format_version"] >= 2:
        shapes.update(calibration_trials=[N_CELLS], calibration_accepted=[N_CELLS])
        for o in (2, 3):
            rows = header[f"context{o}_rows"]
            shapes.update({f"context{o}_keys": [rows], f"context{o}_ids": [rows, k]})
            shapes.update({f"context{o}_probs": [rows, k], f"context{o}_kappa": [rows]})
    return shapes


def _check_context_rows(vocab: int, order: int, arrays: dict[str, np.ndarray]) -> None:
    keys, ids, probs, kappa = (arrays[f"context{order}_{part}"] for part in ("keys", "ids", "probs", "kappa"))
    name = f"context{order}"
    mask = (1 << TOKEN_BITS) - 1
    tokens = [(keys >> (TOKEN_BITS * shift)) & mask for shift in range(3)]
    if keys.size and (
        int(keys.min()) < 0
        or any(int(t.max()) >= vocab for t in tokens)
        or (order == 2 and int(tokens[2].max()) != 0)
        or len(np.unique(keys)) != len(keys)
    ):
        raise _Invalid(f"has invalid keys in tensor '{name}_keys' (tokens out of range [0, {vocab}) or repeated)")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise _Invalid(f"has token ids out of range [0, {vocab}) in tensor '{name}_ids'")
    if not (np.isfinite(probs).all() and np.isfinite(kappa).all()):
        raise _Invalid(f"has NaN or infinite values in tensors '{name}_probs' / '{name}_kappa'")
    if (probs.size and (float(probs.min()) < 0 or float(probs.max()) > 1)) or (
        kappa.size and (float(kappa.min()) < 0 or float(kappa.max()) > 1)
    ):
        raise _Invalid(f"has values out of [0, 1] in tensors '{name}_probs' / '{name}_kappa'")


def _check_values(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Value ranges of the tensors and ``rows_filled``."""
    vocab = header["vocab_size"]
    ids, probs, kappa, filled = arrays["ids"], arrays["probs"], arrays["kappa"], arrays["filled"]
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise _Invalid(f"has token ids out of range [0, {vocab}) in tensor 'ids'")
    if not np.isfinite(probs).all():
        raise _Invalid("has NaN or infinite probabilities in tensor 'probs'")
    if probs.size and float(probs.min()) < 0:
        raise _Invalid("has negative probabilities in tensor 'probs'")
    if probs.size and float(probs.max()) > 1:
        raise _Invalid("has probabilities above 1 in tensor 'probs'")
    if not np.isfinite(kappa).all():
        raise _Invalid("has NaN or infinite values in tensor 'kappa' (must be in [0, 1])")
    if kappa.size and (float(kappa.min()) < 0 or float(kappa.max()) > 1):
        raise _Invalid("has values out of [0, 1] in tensor 'kappa'")
    if filled.size and int(filled.max()) > 1:
        raise _Invalid("has values other than 0 and 1 in tensor 'filled'")
    if "calibration_trials" in arrays:
        trials, accepted = arrays["calibration_trials"], arrays["calibration_accepted"]
        if not (np.isfinite(trials).all() and np.isfinite(accepted).all()):
            raise _Invalid("has NaN or infinite calibration counts")
        if float(accepted.min()) < 0 or bool((accepted > trials).any()):
            raise _Invalid("has calibration counts out of range (need 0 <= calibration_accepted <= calibration_trials)")
        for order in (2, 3):
            _check_context_rows(vocab, order, arrays)
    rows = int(np.count_nonzero(filled))
    if rows != header["rows_filled"]:
        raise _Invalid(
            f"header says rows_filled={header['rows_filled']} but tensor 'filled' marks {rows} rows: "
            "header and tensors are inconsistent"
        )


def _check_content(header: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """The checks of a loaded file, applied to an in-memory snapshot (used before saving)."""
    _check_header(header)
    for name, shape in _shapes(header).items():
        if list(tensors[name].shape) != shape:
            raise _Invalid(f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {shape}")
    _check_values(header, tensors)


def _check_expected(header: dict[str, Any], expected: Any) -> None:
    """The file against the model / tokenizer / processor it is meant for."""
    if expected is None:
        return
    if _tokenizer_of(expected) is None:  # a model: its output vocabulary
        vocab = output_vocab_size(expected)
        if header["vocab_size"] != vocab:
            raise _Invalid(
                f"vocab mismatch: the memory covers {header['vocab_size']} tokens but "
                f"{type(expected).__name__} has {vocab} output logits; it was made for another model"
            )
        return
    want = tokenizer_fingerprint(expected)
    have = header["fingerprint"]
    if not have:
        raise _Invalid(
            "has no tokenizer fingerprint, so it cannot be checked against the tokenizer given "
            "(fingerprint mismatch); set memory.fingerprint = recap.tokenizer_fingerprint(tokenizer) before saving"
        )
    if have != want:
        raise _Invalid(
            f"tokenizer fingerprint mismatch (file {have[:16]}..., expected {want[:16]}...): "
            "it was made with another tokenizer"
        )


def _check_expected_arg(expected: Any) -> None:
    if expected is None or _tokenizer_of(expected) is not None:
        return
    if not hasattr(expected, "get_output_embeddings"):
        raise TypeError(f"expected must be a model, tokenizer or processor, got {type(expected).__name__}")


def _load(path: PathLike, expected: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
    """Validated (header, arrays, file size) of ``path``; every problem is a MemoryFileError."""
    _check_expected_arg(expected)
    shown = os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)
    try:
        data = _read(os.fspath(path))
        header, raw = _parse(data)
        _check_header(header)
        arrays = _check_tensors(header, raw)
        _check_values(header, arrays)
        _check_expected(header, expected)
    except _Invalid as e:
        raise MemoryFileError(f"memory file {shown} {e}") from None
    except MemoryFileError:
        raise
    except Exception as e:  # a gap in the checks above: still reported as a bad file, never a crash
        # (KeyboardInterrupt, SystemExit are not Exceptions and propagate)
        raise MemoryFileError(f"memory file {shown} could not be read ({type(e).__name__}: {e})") from e
    return header, arrays, len(data)


def read_file(path: PathLike, expected: Any = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The validated (header, tensors) of a memory file (``TokenMemory.load`` builds the memory).

    ``expected``, optional, is what the memory will be used with: a model (its output
    vocabulary size must match) or a tokenizer / processor (its ``tokenizer_fingerprint``
    must match the file's). Every problem with the file (missing, not safetensors,
    truncated, bad header, wrong format, version, method, shapes, dtypes, values, or a
    mismatch with ``expected``) raises ``MemoryFileError`` naming the file and the problem.
    """
    header, arrays, _ = _load(path, expected)
    return header, arrays


def memory_info(path: PathLike) -> dict[str, Any]:
    """The header of a memory file (validated like ``load_memory``) and its size in bytes."""
    header, _, size = _load(path, None)
    return {
        "method": header["method"],
        "k": header["k"],
        "vocab_size": header["vocab_size"],
        "fingerprint": header["fingerprint"],
        "rows_filled": header["rows_filled"],
        "size_bytes": size,
        "format_version": header["format_version"],
        "max_context_rows": header.get("max_context_rows"),
        "created": header["created"],
        "recap_version": header["recap_version"],
    }
