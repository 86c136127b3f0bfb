"""The decode loop itself (``recap.loop.run``) on a real tiny model: what it asks of the drafter
and the target and in which order, what each step commits, streaming, stopping inside an
accepted path, and the step times it records. The drafter here is a real ``Drafter`` that knows
the answer (plain greedy decoding's tokens) and hides it among wrong branches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from tiny_models import build
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from recap.backends.hf import HFTarget
from recap.core.accept import Acceptance
from recap.core.rules import TokenRules
from recap.core.step_cost import StepCost
from recap.core.topk import TopK
from recap.core.tree import DraftTree
from recap.loop import run

N = 40
DEPTH = 3


def greedy_answer(model, input_ids: torch.Tensor, n: int) -> list[int]:
    """Plain greedy decoding, one full forward per token (no cache): the loop's reference."""
    ids = input_ids.clone()
    with torch.inference_mode():
        for _ in range(n):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, input_ids.shape[1] :].tolist()


class OracleDrafter:
    """Proposes, each step, a wrong chain first and the next ``depth`` answer tokens as the root's
    second child: the loop must accept the off-chain path. Records every call."""

    name = "oracle"

    def __init__(self, answer: list[int], prompt_length: int, depth: int, wrong: int) -> None:
        self.answer, self.prompt_length, self.depth, self.wrong = answer, prompt_length, depth, wrong
        self.calls: list[str] = []
        self.trees: list[DraftTree] = []
        self.observed: list[tuple[int, Acceptance, list[int]]] = []
        self.prompt_rows = -1

    def prefill_positions(self, prompt_ids: Sequence[int]) -> list[int]:
        self.calls.append("prefill_positions")
        return [0, len(prompt_ids) - 2]

    def begin(self, prompt_ids: Sequence[int], positions: Sequence[int], prompt_topk: TopK | None) -> None:
        self.calls.append("begin")
        self.prompt_rows = -1 if prompt_topk is None else len(prompt_topk)

    def propose(self, history: Sequence[int]) -> DraftTree:
        self.calls.append("propose")
        done = len(history) - self.prompt_length
        right = self.answer[done : done + self.depth]
        tokens = [history[-1], self.wrong, self.wrong, *right]  # root, a wrong chain of 2, the answer
        parents = [-1, 0, 1, 0, *range(3, 3 + len(right) - 1)]
        tree = DraftTree.from_lists(tokens, parents)
        self.trees.append(tree)
        return tree

    def observe(self, tree: DraftTree, topk: TopK, acceptance: Acceptance, committed: Sequence[int]) -> None:
        self.calls.append("observe")
        self.observed.append((len(topk), acceptance, list(committed)))

    def end(self) -> None:
        self.calls.append("end")


class RecordingTarget(HFTarget):
    """The real HF target, recording the loop's calls."""

    def __init__(self, model, k: int) -> None:
        super().__init__(model, k)
        self.calls: list[str] = []
        self.commits: list[list[int]] = []
        self.threads: list[int] = []  # torch's thread count at each verify

    def prefill(self, inputs, positions):
        self.calls.append("prefill")
        return super().prefill(inputs, positions)

    def verify(self, tree):
        self.calls.append("verify")
        self.threads.append(torch.get_num_threads())
        return super().verify(tree)

    def commit(self, path):
        self.calls.append("commit")
        self.commits.append(list(path))
        super().commit(path)

    def close(self) -> None:
        self.calls.append("close")
        super().close()


class Stream:
    def __init__(self) -> None:
        self.chunks: list[list[int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.tolist())

    def end(self) -> None:  # the entry's job, never the loop's
        raise AssertionError("the loop ended the stream")


@pytest.fixture(scope="module")
def llama():
    model, tokenizer = build("llama")
    inputs = tokenizer("w1 w2 the red w3 is w4 of two", return_tensors="pt")
    answer = greedy_answer(model, inputs["input_ids"], N + DEPTH + 1)
    return model, inputs, answer


def rules_for(input_ids: torch.Tensor, n: int, eos: int | None = None) -> TokenRules:
    criteria = [MaxLengthCriteria(max_length=input_ids.shape[1] + n)]
    if eos is not None:
        criteria.append(EosTokenCriteria(eos_token_id=torch.tensor([eos])))
    return TokenRules(LogitsProcessorList(), StoppingCriteriaList(criteria), False, input_ids)


def wrong_token(answer: list[int], vocab: int) -> int:
    return next(t for t in range(vocab) if t not in answer)


def test_the_loop_accepts_the_off_chain_path_and_commits_its_kv(llama) -> None:
    model, inputs, answer = llama
    prompt = inputs["input_ids"][0].tolist()
    target = RecordingTarget(model, k=4)
    drafter = OracleDrafter(answer, len(prompt), DEPTH, wrong_token(answer, target.vocab_size))
    stream = Stream()
    cost = StepCost(8, explore_every=0, sweep_every=0)
    result = run(target, drafter, rules_for(inputs["input_ids"], N), inputs, prompt, streamer=stream, cost=cost)

    assert result.token_ids == answer[:N]  # the KV of each accepted off-chain path was kept right
    steps = len(drafter.trees)
    # the first token comes from the prefill; then every step commits the 3 answer drafts and the bonus
    assert steps == -(-(N - 1) // (DEPTH + 1))
    for _, acceptance, committed in drafter.observed[:-1]:
        assert acceptance.path == [0, 3, 4, 5] and len(committed) == DEPTH + 1
    assert all(rows == len(tree) for (rows, _, _), tree in zip(drafter.observed, drafter.trees))
    assert drafter.prompt_rows == 2  # the top-k of the two prompt positions it asked for
    # call order: drafter prefill_positions, begin, (propose, observe)*, end; target prefill, (verify, commit)*
    # with no commit after the step that finishes, then close
    assert drafter.calls == ["prefill_positions", "begin", *["propose", "observe"] * steps, "end"]
    assert target.calls == ["prefill", *["verify", "commit"] * (steps - 1), "verify", "close"]
    assert target.commits[:-1] == [[0, 3, 4, 5]] * (steps - 2) and target.cache is None
    # the stream gets the first token, then each step's committed tokens, and is not ended
    assert stream.chunks[0] == [answer[0]] and sum(stream.chunks, []) == result.token_ids
    assert [len(c) for c in stream.chunks[1:]] == [len(c) for _, _, c in drafter.observed]
    # statistics and step times
    stats = result.stats
    assert stats.method == "oracle" and stats.new_tokens == N and stats.steps == steps
    assert stats.mean_accepted_length == pytest.approx((N - 1) / steps)
    assert set(cost.measured()) == {6} and stats.time_total >= stats.time_verify > 0


def test_the_loop_stops_at_eos_inside_an_accepted_path(llama) -> None:
    model, inputs, answer = llama
    prompt = inputs["input_ids"][0].tolist()
    eos = answer[6]
    stop = answer.index(eos)  # the first time the answer holds that token
    target = RecordingTarget(model, k=4)
    drafter = OracleDrafter(answer, len(prompt), DEPTH, wrong_token(answer, target.vocab_size))
    result = run(target, drafter, rules_for(inputs["input_ids"], N, eos=eos), inputs, prompt)
    assert result.token_ids == answer[: stop + 1]
    assert drafter.calls[-1] == "end" and target.calls[-2:] == ["verify", "close"]


def test_a_root_only_drafter_decodes_one_token_per_step(llama) -> None:
    from recap.drafters import NoDrafter

    model, inputs, answer = llama
    prompt = inputs["input_ids"][0].tolist()
    target = RecordingTarget(model, k=4)
    result = run(target, NoDrafter(), rules_for(inputs["input_ids"], 12), inputs, prompt)
    assert result.token_ids == answer[:12] and result.stats.steps == 11
    assert result.stats.mean_accepted_length == 1.0
    assert np.all(np.asarray(target.commits) == 0)  # each step keeps only its root


@pytest.fixture
def two_threads():
    caller = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(caller)


def test_steps_run_on_the_thread_counts_chosen_and_the_callers_comes_back(llama, two_threads) -> None:
    """With the thread choice on and a trial at every chance, steps run on 1 and 2 threads, the
    tokens stay plain greedy decoding's, the stats count the steps per count, and the caller's
    count is set back at the end, also when a step raises."""
    from recap.core.threads import ThreadChoice
    from recap.drafters import NoDrafter

    model, inputs, answer = llama
    prompt = inputs["input_ids"][0].tolist()
    cost = StepCost(8, explore_every=0, sweep_every=0)
    cost.threads = ThreadChoice(trial_steps=2, explore_share=10.0, every=1)
    target = RecordingTarget(model, k=4)
    result = run(
        target, NoDrafter(), rules_for(inputs["input_ids"], 30), inputs, prompt, cost=cost, choose_threads=True
    )
    assert result.token_ids == answer[:30]
    assert set(target.threads) == {1, 2} and torch.get_num_threads() == 2
    assert result.stats.steps_by_threads == {n: target.threads.count(n) for n in (1, 2)}

    class Failing(RecordingTarget):
        def verify(self, tree):
            if torch.get_num_threads() == 1:  # the first step on one thread fails
                raise RuntimeError("a failing forward")
            return super().verify(tree)

    failing = Failing(model, k=4)
    with pytest.raises(RuntimeError, match="a failing forward"):
        run(failing, NoDrafter(), rules_for(inputs["input_ids"], 30), inputs, prompt, cost=cost, choose_threads=True)
    assert torch.get_num_threads() == 2
    # without the choice, every step runs on the caller's count
    plain = RecordingTarget(model, k=4)
    result = run(plain, NoDrafter(), rules_for(inputs["input_ids"], 30), inputs, prompt, cost=cost)
    assert set(plain.threads) == {2} and not result.stats.steps_by_threads
