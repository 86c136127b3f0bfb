"""``recap bench``: side-by-side speed and losslessness of decoding methods on one model."""

from .methods import ALL_METHODS, MethodSpec, ablation_specs, parse_methods
from .report import aggregate, markdown, summarize, write
from .run import run_bench
from .workloads import Request, jsonl_requests, suite_requests

__all__ = [
    "ALL_METHODS",
    "MethodSpec",
    "Request",
    "ablation_specs",
    "aggregate",
    "jsonl_requests",
    "markdown",
    "parse_methods",
    "run_bench",
    "suite_requests",
    "summarize",
    "write",
]
