"""RECAP vs vLLM's own drafting methods inside vLLM: ``python -m recap.vllm.bench``.

Each method gets its own engine on the same model (vLLM fixes the speculative method when an
engine starts) and the same requests (``recap.bench.workloads.suite_requests``), with greedy
sampling in float32:

- ``none``: no speculation (the reference output);
- ``ngram``: vLLM's prompt lookup; ``suffix``: Arctic Inference's suffix decoding (needs the
  ``arctic-inference`` package; left out, with a note, where it does not import);
- ``recap``: RECAP through ``recap.vllm.RecapProposer`` (one chain of up to ``k`` per step);
- ``recap-tree``: RECAP's tree mode (``recap.vllm.RecapTreeProposer``): RECAP's tree of up to
  ``--tree`` nodes verified per step (``recap.vllm.tree_mode``).

Each run is a new engine that, after one warm-up request (32 tokens, not one of the measured
requests; it compiles the drafters' numba kernels), serves every request once, in order,
``batch`` at a time (1: one request at a time; 8: eight concurrent requests). Methods that keep
memories across requests run twice: ``warm`` (what a server does: later requests draft from
what earlier ones taught) and ``cold`` (nothing carried across requests: suffix decoding
without its global tree of past responses, ``suffix_decoding_max_cached_requests=0``; RECAP
with a fresh token memory per request, ``RECAP_VLLM_MEMORY_SCOPE=request``). No measured
request is repeated. Reported per run: vLLM's spec-decode counters (drafts, draft tokens,
accepted tokens, acceptance rate = accepted / draft tokens, mean acceptance length = 1 +
accepted per draft step, accepted per position), tokens per forward (output tokens /
per-request steps), wall and CPU time, tokens/s, and the share of outputs equal to the
reference's.

Set the environment before vLLM is imported (``engine_env``): this module does it when run as
a script. On a CPU, vLLM's speculative steps are costly, so tokens/s says little about a GPU;
acceptance per verified token is what carries over.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

METHODS = ("none", "ngram", "suffix", "recap", "recap-tree")
TREE_NODES = 32  # recap-tree's nodes per step (--tree)
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process: ~2 s to start, statistics readable
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # threads as OMP_NUM_THREADS says (auto: one per core, pinned)
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
TREE_STATS = ("tree_steps", "tree_nodes", "branched", "off_chain_accepts", "off_chain_tokens", "kv_moves")


def engine_env() -> None:
    """Defaults for running vLLM in this process (call before importing vllm)."""
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)


def speculative(method: str, k: int, memory: str = "warm", tree: int = TREE_NODES) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` of ``method`` drafting up to ``k`` tokens per step (``memory``
    "cold": nothing carried across requests; RECAP's side of it is an environment variable)."""
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if method == "suffix":
        cold = {"suffix_decoding_max_cached_requests": 0} if memory == "cold" else {}
        return {"method": "suffix", "num_speculative_tokens": k, **cold}
    if method == "recap":
        from . import speculative_config

        return speculative_config(k)
    if method == "recap-tree":
        from . import speculative_config

        return speculative_config(k, tree=tree)
    raise ValueError(f"unknown method {method!r}: choose from {', '.join(METHODS)}")


def suffix_available() -> str | None:
    """None if suffix decoding can run here, else why not."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except Exception as exc:  # ImportError, or a broken native extension
        return f"arctic-inference does not import ({type(exc).__name__}: {exc})"
    return None


def make_llm(
    path: str | os.PathLike,
    method: str = "none",
    k: int = 4,
    max_num_seqs: int = 8,
    memory: str = "warm",
    tree: int = TREE_NODES,
    **kwargs: Any,
) -> Any:
    """A vLLM engine on ``path`` (float32, greedy-ready) with ``method``'s speculation."""
    from vllm import LLM

    settings: dict[str, Any] = dict(
        dtype="float32", max_model_len=2048, enforce_eager=True, limit_mm_per_prompt={"image": 1},
        max_num_seqs=max_num_seqs, max_num_batched_tokens=1024, disable_log_stats=False, seed=0,
    )  # fmt: skip
    settings.update(kwargs)
    # read when the engine creates the proposer, in this process
    with environment(RECAP_VLLM_MEMORY_SCOPE="request" if memory == "cold" else "shared"):
        return LLM(model=str(path), speculative_config=speculative(method, k, memory, tree), **settings)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Environment variables set (None: unset) for the block, restored after it."""
    old = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            _set_env(key, value)
        yield
    finally:
        for key, value in old.items():
            _set_env(key, value)


def write_results(out: Path, stem: str, results: list[Any], text: str) -> None:
    """``out/stem.json`` (the results) and ``out/stem.md`` (their markdown), and a line saying so."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"{stem}.md").write_text(text + "\n")
    print(f"wrote {out}/{stem}.json and {stem}.md", file=sys.stderr)


def prompts_for(path: str | os.PathLike, requests: Sequence[Any]) -> list[dict[str, Any]]:
    """vLLM prompts of ``requests`` (``recap.bench.workloads.Request``): the model's chat template
    around the image and the text, as ``recap.loading.build_inputs`` renders it."""
    from ..zoo.image_processor import load_processor

    processor = load_processor(str(path))
    out = []
    for request in requests:
        image = [{"type": "image"}] if request.image is not None else []
        content = [*image, {"type": "text", "text": request.prompt}]
        text = processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        prompt: dict[str, Any] = {"prompt": text}
        if request.image is not None:
            prompt["multi_modal_data"] = {"image": request.image}
        out.append(prompt)
    return out


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's cumulative spec-decode counters (zeros without speculation)."""
    out: dict[str, Any] = {name: 0 for name in COUNTERS}
    out["per_position"] = []
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:spec_decode_")
        if name in COUNTERS:
            out[name] = int(metric.value)
        elif name == "num_accepted_tokens_per_pos":
            out["per_position"] = [int(v) for v in metric.values]
    return out


def generate(llm: Any, prompts: Sequence[dict[str, Any]], max_tokens: Sequence[int], batch: int) -> list[list[int]]:
    """Greedy outputs of ``prompts``, ``batch`` requests at a time (concurrent within a batch)."""
    from vllm import SamplingParams

    outputs: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens[start : start + batch]]
        for result in llm.generate(list(chunk), params, use_tqdm=False):
            outputs.append(list(result.outputs[0].token_ids))
    return outputs


def measure(llm: Any, prompts: Sequence[dict[str, Any]], max_tokens: Sequence[int], batch: int) -> dict[str, Any]:
    """One pass over the prompts: outputs, time and the spec-decode counters of this pass."""
    before = spec_counters(llm)
    start, cpu = time.perf_counter(), time.process_time()
    outputs = generate(llm, prompts, max_tokens, batch)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = spec_counters(llm)
    counts = {name: after[name] - before[name] for name in COUNTERS}
    per_position = [a - b for a, b in zip(after["per_position"], before["per_position"] or [0] * 64)]
    tokens = sum(len(o) for o in outputs)
    accepted, drafts, draft_tokens = counts["num_accepted_tokens"], counts["num_drafts"], counts["num_draft_tokens"]
    return {
        "outputs": outputs,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "cpu_seconds": cpu,  # this process's CPU time: unlike wall time, not inflated when the machine pauses it
        "tokens_per_cpu_second": tokens / cpu if cpu > 0 else 0.0,
        **counts,
        "accepted_per_position": per_position,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "tokens_per_forward": tokens / (tokens - accepted) if tokens > accepted else 1.0,
    }


def run(
    model: str,
    methods: Sequence[str],
    samples: int,
    max_tokens: int,
    batches: Sequence[int],
    k: int,
    seed: int = 0,
    families: str = "all",
    log=print,
    tree: int = TREE_NODES,
) -> dict[str, Any]:
    """The whole comparison on one model (see the module docstring)."""
    from ..bench.workloads import suite_requests
    from .models import model_path
    from .proposer import live_proposers

    path = model_path(model)
    requests = suite_requests(families, samples, seed)
    prompts = prompts_for(path, requests)
    warmup = prompts_for(path, suite_requests("all", 1, seed + 1000)[:1])  # compiles the drafters' kernels
    lengths = [max_tokens] * len(prompts)
    result: dict[str, Any] = {
        "model": model, "requests": [r.id for r in requests], "max_tokens": max_tokens, "k": k,
        "batches": list(batches), "tree": tree, "runs": [], "left_out": {},
    }  # fmt: skip
    reference: dict[int, list[list[int]]] = {}
    for method in methods:
        if method == "suffix" and (why := suffix_available()):
            result["left_out"]["suffix"] = why
            log(f"suffix left out: {why}")
            continue
        for batch in batches:
            for memory in ("cold", "warm") if method in ("suffix", "recap", "recap-tree") else ("-",):
                before = set(map(id, live_proposers()))
                llm = make_llm(path, method, k, max_num_seqs=batch, memory=memory, tree=tree)
                try:
                    generate(llm, warmup, [32], 1)
                    proposer = next((p for p in live_proposers() if id(p) not in before), None)
                    stats = dict(proposer.stats.as_dict()) if proposer is not None else None
                    run_ = measure(llm, prompts, lengths, batch)
                    if proposer is not None and method == "recap-tree":
                        now = proposer.stats.as_dict()
                        run_["tree_stats"] = {key: now[key] - stats[key] for key in TREE_STATS}
                        run_["tree_fallback"] = proposer.tree_reason
                finally:
                    del llm
                    _free_engine()
                outputs = run_.pop("outputs")
                if method == "none":
                    reference[batch] = outputs
                same = [a == b for a, b in zip(outputs, reference[batch])]
                run_.update(method=method, batch=batch, memory=memory, match=sum(same) / len(same))
                run_["output_lengths"] = [len(o) for o in outputs]
                result["runs"].append(run_)
                log(summary_line(run_))
    return result


def _free_engine() -> None:
    """Let the next engine start in this process (vLLM's own tests do the same between engines)."""
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    gc.collect()
    cleanup_dist_env_and_memory()


def summary_line(run_: dict[str, Any]) -> str:
    return (
        f"{run_['method']:>10} batch {run_['batch']} {run_['memory']}: "
        f"accepted/step {run_['mean_acceptance_length']:.2f}  acceptance {run_['acceptance_rate']:.3f}  "
        f"tokens/forward {run_['tokens_per_forward']:.2f}  {run_['tokens_per_second']:.1f} tok/s  "
        f"match {run_['match']:.3f}"
    )


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """One table per model: a row per (method, batch, memory)."""
    lines = []
    for result in results:
        lines += [
            f"**{result['model']}** ({len(result['requests'])} requests, {result['max_tokens']} new tokens each, "
            f"k={result['k']}, recap-tree: {result.get('tree', TREE_NODES)} nodes)",
            "",
            "| method | batch | memory | accepted / step | acceptance rate | tokens / forward "
            "| tokens/s | tokens/CPU-s | match |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in result["runs"]:
            spec = r["method"] != "none"
            accepted = f"{r['mean_acceptance_length']:.2f} | {r['acceptance_rate']:.3f}" if spec else "- | -"
            lines.append(
                f"| {r['method']} | {r['batch']} | {r['memory']} | {accepted} | {r['tokens_per_forward']:.2f} | "
                f"{r['tokens_per_second']:.1f} | {r['tokens_per_cpu_second']:.1f} | {r['match']:.3f} |"
            )
        for method, why in result["left_out"].items():
            lines.append(f"\n{method}: left out ({why})")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recap.vllm.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="embedded model name or folder (repeatable)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from " + ", ".join(METHODS))
    parser.add_argument("--samples", type=int, default=2, help="requests per suite family")
    parser.add_argument("--families", default="all")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("-k", type=int, default=4, help="tokens drafted per step, every chain method")
    parser.add_argument("--tree", type=int, default=TREE_NODES, help="recap-tree: draft nodes verified per step")
    parser.add_argument("--out", type=Path, help="folder for results.json and results.md")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    methods = ["none", *(m for m in methods if m != "none")]  # the reference output first
    bad = [m for m in methods if m not in METHODS]
    if bad:
        parser.error(f"unknown methods {bad}: choose from {', '.join(METHODS)}")
    batches = [int(b) for b in args.batch.split(",")]
    engine_env()
    from . import tap

    tap.prepare()
    results = []
    for model in args.model or ["tiny-qwen2.5-vl", "tiny-llava-next"]:
        results.append(
            run(model, methods, args.samples, args.max_tokens, batches, args.k, families=args.families, tree=args.tree)
        )
    text = markdown(results)
    print(text)
    if args.out:
        write_results(args.out, "results", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
