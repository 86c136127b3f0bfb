"""The device the model tests run on: ``RECAP_TEST_DEVICE`` (default cpu; ``tools/gpu_check.py`` sets cuda)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

DEVICE = torch.device(os.environ.get("RECAP_TEST_DEVICE", "cpu"))


def to_device(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """A request's inputs (a processor's BatchFeature or a dict) with its tensors on ``DEVICE``."""
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
