"""recap: lossless training-free speculative decoding for vision-language models and LLMs
by recycling the target's own top-k predictions under contextual keys (RECAP)."""

from . import zoo as zoo
from .config import RecapConfig
from .decode import GenerationResult, default_memory, generate
from .errors import (
    InputError,
    MemoryFileError,
    RecapError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)
from .hf_generate import speculative
from .memory import ContextMemory, TokenMemory
from .persist import load_memory, memory_info, save_memory, tokenizer_fingerprint
from .stats import DecodeStats
from .topk import TopK
from .tree import DraftTree, Source

__version__ = "0.1.0"

__all__ = [
    "ContextMemory",
    "DecodeStats",
    "DraftTree",
    "GenerationResult",
    "InputError",
    "MemoryFileError",
    "RecapConfig",
    "RecapError",
    "Source",
    "TokenMemory",
    "TopK",
    "UnsupportedGenerationError",
    "UnsupportedModelError",
    "default_memory",
    "generate",
    "load_memory",
    "memory_info",
    "save_memory",
    "speculative",
    "tokenizer_fingerprint",
]
