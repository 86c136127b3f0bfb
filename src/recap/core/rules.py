"""What ``generate`` does at each new token of one request, replayed over verified draft trees.

``generate`` builds a list of logits processors (repetition penalty, no-repeat n-grams, min new
tokens, suppressed and bad words, sequence bias, temperature, top-k, top-p, min-p, typical,
epsilon/eta, ...) and a list of stopping criteria (max length, EOS, stop strings, max time, ...),
then for every new token: processes the float32 logits given the sequence so far, picks the argmax
(greedy) or draws ``torch.multinomial(softmax(scores), 1)`` (sampling), appends it and asks the
criteria whether to stop. ``TokenRules`` does exactly that, one token at a time, over a buffer
holding the request's sequence (prompt + tokens emitted so far), so that each processor sees the
very prefix and the very tensor shapes it sees in ``generate``.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria


class TokenRules:
    """The logits processors, the token choice and the stopping criteria of one request.

    ``prompt``: [1, L] token ids. ``fast`` is True for plain greedy decoding (no processor, no
    sampling): the next token at every node is then the argmax of the raw logits, which the decode
    loop takes from the verification in one vectorised step instead of calling ``choose`` per token.
    EOS ids and the maximum length are read from generate's ``EosTokenCriteria`` and
    ``MaxLengthCriteria`` and checked on plain ints; every other criterion (stop strings, max time,
    yours) is called on the sequence after each token, as ``generate`` does.
    """

    def __init__(
        self,
        logits_processor: LogitsProcessorList | None,
        stopping_criteria: StoppingCriteriaList | None,
        do_sample: bool,
        prompt: torch.Tensor,
    ) -> None:
        self.processors = logits_processor if logits_processor is not None else LogitsProcessorList()
        self.do_sample = bool(do_sample)
        self.fast = not self.do_sample and len(self.processors) == 0
        criteria = list(stopping_criteria or [])
        self.eos = frozenset(
            int(t) for c in criteria if type(c) is EosTokenCriteria for t in c.eos_token_id.reshape(-1).tolist()
        )
        limits = [c.max_length for c in criteria if type(c) is MaxLengthCriteria and c.max_length is not None]
        self.max_length = min(limits) if limits else None
        self.criteria = [c for c in criteria if type(c) not in (EosTokenCriteria, MaxLengthCriteria)]
        self.length = int(prompt.shape[1])
        self.device = prompt.device  # generate processes and draws where its input_ids are
        # the sequence is kept as a tensor only when something reads it (processors or criteria)
        self.tracks = not self.fast or bool(self.criteria)
        self.ids = None
        if self.tracks:
            capacity = self.max_length if self.max_length is not None else self.length + 256
            self.ids = torch.empty((1, max(capacity, self.length + 1)), dtype=torch.long, device=prompt.device)
            self.ids[:, : self.length] = prompt

    @property
    def sequence(self) -> torch.Tensor:
        """[1, length] the request's tokens so far (prompt included)."""
        return self.ids[:, : self.length]

    def choose(self, logits: torch.Tensor) -> int:
        """The next token after the current sequence, given the target's logits there ([1, V])."""
        scores = logits.to(dtype=torch.float32, device=self.device, copy=True)
        scores = self.processors(self.ids[:, : self.length], scores)
        if self.do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            return int(torch.multinomial(probs, num_samples=1)[0, 0])
        return int(torch.argmax(scores, dim=-1)[0])

    def choose_row(self, logits: torch.Tensor, row: int) -> int:
        """``choose`` given row ``row`` of ``logits`` [N, V] (e.g. a tree node's)."""
        return self.choose(logits[row : row + 1])

    def push(self, token: int) -> bool:
        """Append ``token`` to the sequence; True if generation stops with it."""
        if self.tracks:
            if self.length == self.ids.shape[1]:
                self.ids = torch.cat([self.ids, torch.empty_like(self.ids)], dim=1)
            self.ids[0, self.length] = token
        self.length += 1
        if token in self.eos or (self.max_length is not None and self.length >= self.max_length):
            return True
        if self.criteria:
            sequence = self.ids[:, : self.length]
            return any(bool(c(sequence, None).any()) for c in self.criteria)
        return False

    def cut(self, tokens: list[int]) -> tuple[list[int], bool]:
        """Append ``tokens`` up to the first one that stops generation; (those appended, stopped)."""
        for i, token in enumerate(tokens):
            if self.push(token):
                return tokens[: i + 1], True
        return tokens, False
