"""Where recap's greedy tokens leave generate's in low precision, and whether that is a near-tie.

A tree forward computes the same logits as generate's one-token forwards in a different order
(other matrix shapes, other reductions), so in bfloat16 / float16 the two differ by a few
rounding errors. Greedy decoding then flips only where generate's own top two logits are that
close: a near-tie, not a bug. Shared by tests/test_precision.py and tools/precision_agreement.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# a near-tie: generate's logit of the token recap chose is within TIE_ULPS units of the dtype's
# rounding (eps x |top logit|) of generate's top logit
TIE_ULPS = 4


@dataclass(frozen=True)
class Divergence:
    step: int  # index of the first new token that differs
    margin: float  # generate's top logit minus its logit of recap's token there
    tolerance: float  # TIE_ULPS * eps(dtype) * max(1, |top logit|)

    @property
    def near_tie(self) -> bool:
        return self.margin <= self.tolerance


def generate_with_logits(model, inputs, n: int, **kwargs) -> tuple[list[int], torch.Tensor]:
    """generate's new tokens and its raw logits at each step [T, V]."""
    with torch.inference_mode():
        out = model.generate(
            **inputs, do_sample=False, max_new_tokens=n, return_dict_in_generate=True, output_logits=True, **kwargs
        )
    tokens = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    return tokens, torch.stack([step[0] for step in out.logits])


def first_divergence(
    expected: list[int], logits: torch.Tensor, got: list[int], dtype: torch.dtype
) -> Divergence | None:
    """None if ``got`` equals generate's ``expected``; else the first differing step, judged
    on generate's ``logits`` [T, V] with the rounding of the model's ``dtype``."""
    if got == expected:
        return None
    step = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    if step >= len(got) or step >= len(expected):
        raise AssertionError(f"one output is a prefix of the other (lengths {len(got)}, {len(expected)}): not a tie")
    row = logits[step].float()
    top = float(row.max())
    eps = torch.finfo(dtype).eps
    return Divergence(step, top - float(row[got[step]]), TIE_ULPS * eps * max(1.0, abs(top)))
