"""recap: lossless training-free speculative decoding for vision-language models and LLMs
by recycling the target's own top-k predictions under contextual keys (RECAP)."""

from . import zoo as zoo
from .config import RecapConfig
from .core.memory import TokenMemory, load_memory, save_memory
from .core.persist import memory_info, tokenizer_fingerprint
from .core.stats import DecodeStats
from .core.topk import TopK
from .core.tree import DraftTree, Source
from .entry import GenerationResult, RecapGenerateOutput, default_memory, generate, speculative
from .errors import (
    InputError,
    MemoryFileError,
    RecapError,
    UnsupportedGenerationError,
    UnsupportedModelError,
)
from .memory_cache import CachedMemory, cached_memory, memory_cache_path
from .version import __version__

__all__ = [
    "CachedMemory",
    "DecodeStats",
    "DraftTree",
    "GenerationResult",
    "InputError",
    "MemoryFileError",
    "RecapConfig",
    "RecapError",
    "RecapGenerateOutput",
    "Source",
    "TokenMemory",
    "TopK",
    "UnsupportedGenerationError",
    "UnsupportedModelError",
    "__version__",
    "cached_memory",
    "default_memory",
    "generate",
    "load_memory",
    "memory_cache_path",
    "memory_info",
    "save_memory",
    "speculative",
    "tokenizer_fingerprint",
]
