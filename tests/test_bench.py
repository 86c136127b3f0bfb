"""recap bench: JSONL workloads (every bad line named), suite families, aggregation math,
the markdown report, and a tiny end-to-end run on a random LLaVA-NeXT."""

from __future__ import annotations

import io
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import tiny_models
import torch
from PIL import Image

from recap import InputError, RecapConfig
from recap.bench import aggregate, jsonl_requests, markdown, parse_methods, run_bench, suite_requests, summarize, write
from recap.bench.methods import ALL_METHODS, REFERENCE
from recap.loading import build_inputs
from recap.suite import FAMILIES

CONTRACT_KEYS = ("mean_accepted_length", "speedup_mean", "speedup_median", "match_ratio", "samples")


# -- JSONL workloads --------------------------------------------------------------------------
def png(path: Path, color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (32, 24)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def row(**fields: Any) -> str:
    return json.dumps(fields)


def test_jsonl_good_file(tmp_path: Path) -> None:
    png(tmp_path / "imgs" / "a.png", (255, 0, 0), (40, 30))
    png(tmp_path / "b.png", (0, 0, 255), (20, 20))
    data = write_jsonl(
        tmp_path / "data.jsonl",
        [
            row(image="imgs/a.png", prompt="what is red?", family="ocr", id="first"),
            "",
            "   ",
            row(image="b.png", prompt="and blue?"),
            row(prompt="text only", id=7),
            row(prompt="null image", image=None, family="chat"),
        ],
    )
    requests = jsonl_requests(data)
    assert [r.id for r in requests] == ["first", "4", "7", "6"]  # default id: the line number (blank lines count)
    assert [r.family for r in requests] == ["ocr", "data", "data", "chat"]
    assert [r.prompt for r in requests] == ["what is red?", "and blue?", "text only", "null image"]
    first, second = requests[0].image, requests[1].image
    assert first is not None and second is not None
    assert first.mode == "RGB" and first.size == (40, 30) and first.getpixel((0, 0)) == (255, 0, 0)
    assert second.size == (20, 20) and second.getpixel((5, 5)) == (0, 0, 255)
    assert requests[2].image is None and requests[3].image is None


def test_jsonl_image_paths_are_relative_to_the_file_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    png(tmp_path / "sub" / "x.png")
    write_jsonl(tmp_path / "sub" / "d.jsonl", [row(image="x.png", prompt="p")])
    monkeypatch.chdir(tmp_path)
    (request,) = jsonl_requests(Path("sub/d.jsonl"))
    assert request.image is not None


def test_jsonl_limit(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [row(prompt=f"p{i}") for i in range(5)])
    assert [r.prompt for r in jsonl_requests(data, limit=2)] == ["p0", "p1"]
    assert len(jsonl_requests(data, limit=1)) == 1
    assert len(jsonl_requests(data, limit=50)) == 5
    assert len(jsonl_requests(data)) == 5


def test_jsonl_limit_stops_before_later_bad_lines(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [row(prompt="ok"), "{broken"])
    assert len(jsonl_requests(data, limit=1)) == 1


def expect_line_error(data: Path, line: int, *fragments: str) -> str:
    with pytest.raises(InputError) as info:
        jsonl_requests(data)
    message = str(info.value)
    assert f"{data}:{line}" in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


GOOD = row(prompt="fine")


def test_jsonl_invalid_json(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [GOOD, "", '{"prompt": "x",'])
    expect_line_error(data, 3, "not valid JSON")


@pytest.mark.parametrize("line", ['["a list"]', '"a string"', "42", "null"])
def test_jsonl_non_object_line(tmp_path: Path, line: str) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [GOOD, line])
    expect_line_error(data, 2, "JSON object")


@pytest.mark.parametrize(
    "bad",
    [row(image="x.png"), row(prompt=""), row(prompt="   \n"), row(prompt=None), row(prompt=3), row(prompt=["a"])],
    ids=["missing", "empty", "blank", "null", "number", "list"],
)
def test_jsonl_missing_or_empty_prompt(tmp_path: Path, bad: str) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [GOOD, GOOD, bad])
    expect_line_error(data, 3, "'prompt'")


@pytest.mark.parametrize("image", [3, ["a.png"], {"path": "a.png"}, True])
def test_jsonl_non_string_image(tmp_path: Path, image: Any) -> None:
    png(tmp_path / "a.png")
    data = write_jsonl(tmp_path / "d.jsonl", [row(prompt="p", image=image)])
    expect_line_error(data, 1, "'image'")


def test_jsonl_missing_image_file(tmp_path: Path) -> None:
    png(tmp_path / "here.png")
    data = write_jsonl(tmp_path / "d.jsonl", [row(prompt="p", image="here.png"), row(prompt="q", image="gone.png")])
    expect_line_error(data, 2, "gone.png", "not found")


def test_jsonl_image_path_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "folder.png").mkdir()
    data = write_jsonl(tmp_path / "d.jsonl", [row(prompt="p", image="folder.png")])
    expect_line_error(data, 1, "folder.png")


def test_jsonl_unreadable_image(tmp_path: Path) -> None:
    (tmp_path / "garbage.png").write_bytes(b"\x00this is not a png\xff" * 10)
    data = write_jsonl(tmp_path / "d.jsonl", [GOOD, row(prompt="p", image="garbage.png")])
    expect_line_error(data, 2, "garbage.png", "cannot read image")


def test_jsonl_truncated_image(tmp_path: Path) -> None:
    whole = png(tmp_path / "whole.png", size=(64, 64)).read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    data = write_jsonl(tmp_path / "d.jsonl", [row(prompt="p", image="cut.png")])
    expect_line_error(data, 1, "cut.png")


@pytest.mark.parametrize("content", ["", "\n\n   \n"], ids=["empty", "only-blank-lines"])
def test_jsonl_empty_file(tmp_path: Path, content: str) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(content)
    with pytest.raises(InputError, match=re.escape(str(data))) as info:
        jsonl_requests(data)
    assert "no rows" in str(info.value)


def test_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        jsonl_requests(tmp_path / "absent.jsonl")


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["plain", "bom"])
def test_jsonl_bad_encoding_names_the_line(tmp_path: Path, bom: bytes) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(bom + b'{"prompt": "ok"}\n\n{"prompt": "caf\xe9"}\n')  # line 3 is latin-1, not UTF-8
    expect_line_error(data, 3, "UTF-8")


def test_jsonl_byte_order_mark_crlf_and_unicode_separators(tmp_path: Path) -> None:
    """A BOM (Windows editors) and CRLF endings are fine; U+2028 / U+0085 / U+001E inside a JSON
    string are valid JSON and must not split the line (nor shift later line numbers)."""
    data = tmp_path / "d.jsonl"
    lines = [row(prompt="first"), json.dumps({"prompt": "a\u2028b\x85c\x1ed"}, ensure_ascii=False), "[1]"]
    data.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines[:2]).encode() + b"\r\n")
    requests = jsonl_requests(data)
    assert [r.prompt for r in requests] == ["first", "a\u2028b\x85c\x1ed"]
    assert [r.id for r in requests] == ["1", "2"]
    data.write_bytes("\r\n".join(lines).encode())
    expect_line_error(data, 3, "JSON object")


# -- suite workloads ----------------------------------------------------------------------------
def test_suite_all_families() -> None:
    requests = suite_requests("all", 1, 0)
    assert [r.family for r in requests] == list(FAMILIES)
    assert len({r.id for r in requests}) == len(requests)
    assert all(r.prompt.strip() for r in requests)


def test_suite_family_list() -> None:
    requests = suite_requests("ocr, chart", 2, 0)
    assert [r.family for r in requests] == ["ocr", "ocr", "chart", "chart"]
    assert [r.id for r in requests] == ["ocr-0-0", "ocr-0-1", "chart-0-0", "chart-0-1"]
    assert all(r.image is not None for r in requests)
    again = suite_requests("ocr,chart", 2, 0)
    assert [r.prompt for r in again] == [r.prompt for r in requests]  # deterministic


@pytest.mark.parametrize("families", ["ocr,nope", "nope", "", " , ", "ALL"])
def test_suite_unknown_family(families: str) -> None:
    with pytest.raises(InputError, match="unknown suite families") as info:
        suite_requests(families, 1, 0)
    assert "ocr" in str(info.value)  # lists the valid names


def test_parse_methods_adds_reference() -> None:
    assert [s.name for s in parse_methods("ar,recap")] == [REFERENCE, "ar", "recap"]
    assert [s.name for s in parse_methods("recap,generate")] == ["recap", "generate"]
    assert [s.name for s in parse_methods(",".join(ALL_METHODS))] == list(ALL_METHODS)
    variant = parse_methods("recap[paper,budget=31]")[1]
    assert variant.kind == "recap" and variant.name == "recap[paper,budget=31]"
    assert variant.config == RecapConfig.paper(node_budget=31)
    names = [s.name for s in parse_methods("recap[orders=1,2],recap[budget=15,adaptive],ar")]
    assert names == [REFERENCE, "recap[orders=1,2]", "recap[budget=15,adaptive]", "ar"]
    specs = parse_methods("recap[orders=1,2],recap[budget=15,adaptive],recap[fusion=strict,no-suffix]")
    assert specs[1].config.key_orders == (1, 2) and specs[1].config.adaptive_budget
    assert specs[2].config.node_budget == 15 and specs[2].config.adaptive_budget
    assert specs[3].config.fusion == "strict" and specs[3].config.suffix_tokens == 0
    assert not parse_methods("recap[budget=7]")[1].config.adaptive_budget  # a budget alone is fixed
    assert parse_methods("recap[write=committed]")[1].config.write_scope == "committed"
    valued = parse_methods("recap[row-value=0,row-nodes=4]")[1].config
    assert valued.row_value == 0 and valued.row_value_nodes == 4 and RecapConfig().row_value > 0
    assert not parse_methods("recap[fixed-threads]")[1].config.adaptive_threads and RecapConfig().adaptive_threads
    with pytest.raises(ValueError, match="write_scope"):
        parse_methods("recap[write=some]")
    with pytest.raises(ValueError, match="unknown method 'fast'.*recap\\[paper,budget=31\\]"):
        parse_methods("ar,fast")
    with pytest.raises(ValueError, match="recap\\[budget=x\\]: invalid literal"):
        parse_methods("recap[budget=x]")
    with pytest.raises(ValueError, match="unknown option 'turbo'"):
        parse_methods("recap[turbo]")


# -- aggregation ----------------------------------------------------------------------------------
def record(
    request: str,
    family: str,
    method: str,
    seconds: float,
    tokens: list[int],
    match: bool = True,
    accepted: list[int] | None = None,
    nodes: int | None = None,
    host: float | None = None,
    sources: dict[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "request": request,
        "family": family,
        "method": method,
        "tokens": tokens,
        "hash": "x",
        "match": match,
        "seconds": seconds,
        "steps": None if accepted is None else len(accepted),
        "mean_accepted_length": None if not accepted else sum(accepted) / len(accepted),
        "accepted_lengths": accepted,
        "nodes": nodes,
        "host_seconds": host,
        "accepted_by_source": sources,
    }


T1, T2, T3 = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15]
METHODS = ["generate", "hf-prompt-lookup", "ar", "recap"]


def synthetic_records() -> list[dict[str, Any]]:
    """r1, r2 in family ocr, r3 in chart; recap is wrong on r2."""
    return [
        record("r1", "ocr", "generate", 2.0, T1),
        record("r2", "ocr", "generate", 4.0, T2),
        record("r3", "chart", "generate", 3.0, T3),
        record("r1", "ocr", "hf-prompt-lookup", 1.0, T1),
        record("r2", "ocr", "hf-prompt-lookup", 4.0, T2),
        record("r3", "chart", "hf-prompt-lookup", 6.0, T3),
        record("r1", "ocr", "ar", 2.0, T1, accepted=[1, 1, 1], nodes=3, host=0.0003),
        record("r2", "ocr", "ar", 8.0, T2, accepted=[1] * 5, nodes=5, host=0.0005),
        record("r3", "chart", "ar", 3.0, T3, accepted=[1] * 4, nodes=4, host=0.0004),
        record("r1", "ocr", "recap", 1.0, T1, accepted=[2, 1], nodes=20, host=0.002, sources={"memory": 1}),
        record(
            "r2",
            "ocr",
            "recap",
            1.0,
            T2[:-1] + [99],
            match=False,
            accepted=[3, 2],
            nodes=30,
            host=0.004,
            sources={"memory": 2, "context": 1},
        ),
        record("r3", "chart", "recap", 3.0, T3, accepted=[1, 1, 1, 1], nodes=10, host=0.002),
    ]


def test_summarize_math() -> None:
    out = summarize(synthetic_records(), METHODS)
    assert list(out) == METHODS
    approx = pytest.approx

    recap = out["recap"]
    assert recap["samples"] == 3
    assert recap["new_tokens"] == 15
    assert recap["seconds"] == approx(5.0)
    assert recap["speedup_mean"] == approx((2.0 + 4.0 + 1.0) / 3)
    assert recap["speedup_median"] == approx(2.0)
    assert recap["speedup_total"] == approx(9.0 / 5.0)
    assert recap["match_ratio"] == approx(2 / 3)
    assert recap["mean_accepted_length"] == approx(12 / 8)  # committed / steps over all steps
    assert recap["tokens_per_forward"] == approx(15 / (8 + 3))  # + one prefill forward per request
    assert recap["nodes_per_token"] == approx(60 / 15)
    assert recap["host_overhead_us_per_step"] == approx(1e6 * 0.008 / 8)
    assert recap["histogram"] == {"1": 5, "2": 2, "3": 1}
    assert list(recap["histogram"]) == ["1", "2", "3"]  # numeric order
    assert recap["accepted_by_source"] == {"memory": 3, "context": 1}

    ar = out["ar"]
    assert ar["speedup_mean"] == approx((1.0 + 0.5 + 1.0) / 3)
    assert ar["speedup_median"] == approx(1.0)
    assert ar["speedup_total"] == approx(9.0 / 13.0)
    assert ar["match_ratio"] == 1.0
    assert ar["mean_accepted_length"] == approx(1.0)
    assert ar["tokens_per_forward"] == approx(15 / (12 + 3))
    assert ar["nodes_per_token"] == approx(12 / 15)
    assert ar["host_overhead_us_per_step"] == approx(100.0)
    assert ar["histogram"] == {"1": 12}

    hf = out["hf-prompt-lookup"]
    assert hf["speedup_mean"] == approx((2.0 + 1.0 + 0.5) / 3)
    assert hf["speedup_median"] == approx(1.0)
    assert hf["speedup_total"] == approx(9.0 / 11.0)

    for method in ("generate", "hf-prompt-lookup"):  # no steps: no step statistics
        s = out[method]
        for key in (
            "mean_accepted_length",
            "tokens_per_forward",
            "nodes_per_token",
            "host_overhead_us_per_step",
            "histogram",
            "accepted_by_source",
        ):
            assert s[key] is None, (method, key)
    gen = out["generate"]
    assert gen["speedup_mean"] == gen["speedup_median"] == gen["speedup_total"] == approx(1.0)
    assert gen["match_ratio"] == 1.0 and gen["samples"] == 3


def test_summarize_speedups_are_per_request_ratios() -> None:
    """mean/median average per-request ratios, total is the ratio of total times."""
    records = synthetic_records()
    ratios = {}
    for r in records:
        if r["method"] == "recap":
            ref = next(x for x in records if x["request"] == r["request"] and x["method"] == REFERENCE)
            ratios[r["request"]] = ref["seconds"] / r["seconds"]
    out = summarize(records, ["recap"])["recap"]
    assert out["speedup_mean"] == pytest.approx(statistics.fmean(ratios.values()))
    assert out["speedup_median"] == pytest.approx(statistics.median(ratios.values()))


def test_summarize_skips_missing_methods_and_unreferenced_requests() -> None:
    records = synthetic_records() + [record("r4", "ocr", "recap", 0.1, [1], accepted=[], nodes=0, host=0.0)]
    out = summarize(records, ["recap", "pld"])
    assert list(out) == ["recap"]  # pld never ran
    assert out["recap"]["samples"] == 3  # r4 has no reference run


def test_summarize_two_requests() -> None:
    """The brief's minimal case: 2 requests x generate/ar/recap."""
    records = [r for r in synthetic_records() if r["request"] != "r3" and r["method"] != "hf-prompt-lookup"]
    out = summarize(records, ["generate", "ar", "recap"])
    recap = out["recap"]
    assert recap["speedup_mean"] == pytest.approx(3.0)
    assert recap["speedup_median"] == pytest.approx(3.0)
    assert recap["speedup_total"] == pytest.approx(6.0 / 2.0)
    assert recap["match_ratio"] == 0.5
    assert recap["mean_accepted_length"] == pytest.approx(8 / 4)
    assert recap["tokens_per_forward"] == pytest.approx(10 / (4 + 2))
    assert recap["nodes_per_token"] == pytest.approx(50 / 10)
    assert recap["host_overhead_us_per_step"] == pytest.approx(1e6 * 0.006 / 4)
    assert out["generate"]["mean_accepted_length"] is None
    assert out["ar"]["speedup_total"] == pytest.approx(6.0 / 10.0)


def test_ceiling_uses_generates_time_per_token_in_the_same_runs() -> None:
    records = synthetic_records()
    assert summarize(records, METHODS)["recap"]["ceiling"] is None  # no prefill times: no per-token time
    prefills = {"r1": 0.5, "r2": 1.0, "r3": 0.6}
    for r in records:
        if r["method"] == "recap":
            r["prefill_seconds"] = prefills[r["request"]]
            r["verify_seconds"] = 0.2 * len(r["accepted_lengths"])  # 200 ms per verify forward
    # generate: (2.0 - 0.5) + (4.0 - 1.0) + (3.0 - 0.6) seconds over 3 + 5 + 4 tokens after the first
    per_token = 1000 * (1.5 + 3.0 + 2.4) / 12
    assert aggregate(records, METHODS)["generate_ms_per_token"] == pytest.approx(per_token)
    recap = summarize(records, METHODS)["recap"]
    assert recap["verify_ms_per_step"] == pytest.approx(200.0)
    assert recap["ceiling"] == pytest.approx(recap["mean_accepted_length"] * per_token / 200.0)
    assert recap["of_ceiling"] == pytest.approx(recap["speedup_mean"] / recap["ceiling"])


def test_aggregate_per_family() -> None:
    results = aggregate(synthetic_records(), METHODS)
    assert set(results) == {"overall", "families", "generate_ms_per_token"}
    assert list(results["families"]) == ["ocr", "chart"]
    ocr, chart = results["families"]["ocr"]["recap"], results["families"]["chart"]["recap"]
    assert ocr["samples"] == 2 and chart["samples"] == 1
    assert ocr["speedup_mean"] == pytest.approx(3.0)
    assert ocr["speedup_total"] == pytest.approx(3.0)
    assert ocr["match_ratio"] == 0.5
    assert ocr["mean_accepted_length"] == pytest.approx(8 / 4)
    assert ocr["histogram"] == {"1": 1, "2": 2, "3": 1}
    assert chart["speedup_mean"] == pytest.approx(1.0)
    assert chart["match_ratio"] == 1.0
    assert chart["mean_accepted_length"] == pytest.approx(1.0)
    assert chart["tokens_per_forward"] == pytest.approx(5 / (4 + 1))
    assert results["overall"] == summarize(synthetic_records(), METHODS)
    for family in results["families"].values():
        for summary in family.values():
            assert all(key in summary for key in CONTRACT_KEYS)


def synthetic_results(mismatches: list[dict[str, str]]) -> dict[str, Any]:
    results = aggregate(synthetic_records(), METHODS)
    results["settings"] = {
        "model": "tiny-test",
        "device": "cpu",
        "dtype": "float32",
        "workload": "suite ocr,chart",
        "requests": 3,
        "max_new_tokens": 24,
        "memory": "warm",
        "memory_note": "carried across requests",
        "protocol": "rotated",
        "date": "2025-01-01T00:00:00+00:00",
        "machine": "test",
    }
    results["mismatches"] = mismatches
    return results


def test_markdown_tables() -> None:
    text = markdown(synthetic_results([]))
    assert text.startswith("# recap bench report")
    assert "`tiny-test`" in text and "max_new_tokens 24" in text and "**warm**" in text
    assert "## Overall" in text and "## Family: ocr" in text and "## Family: chart" in text
    assert text.count("| method | MAL | tok/fwd |") == 3
    table_lines = [line for line in text.splitlines() if line.startswith("| recap |")]
    assert len(table_lines) == 3
    overall = table_lines[0].strip("| ").split(" | ")
    assert overall[1:4] == ["1.50", "1.36", "4.0"]  # MAL, tok/fwd, nodes/tok
    assert overall[4:8] == ["2.33", "2.00", "1.80", "0.667"]  # speedups, match (no rounds column without repeats)
    assert "rounds" not in text
    generate_row = next(line for line in text.splitlines() if line.startswith("| generate |"))
    assert generate_row.split(" | ")[1] == "-"  # no MAL for the reference
    assert "MISMATCHES" not in text
    assert "![speedup](speedup.png)" in text


def test_rounds_give_the_mean_speedup_of_each_repeat_round() -> None:
    """With repeats, round j pairs generate's j-th time on a request with the method's j-th; the
    report shows the lowest and highest round mean next to the speedups."""
    records = []
    for request, family, generate_times, recap_times in (
        ("r1", "ocr", [2.0, 2.2, 1.8], [1.0, 2.0, 1.2]),
        ("r2", "chart", [3.0, 3.0, 3.3], [3.0, 1.5, 1.1]),
    ):
        for method, times in (("generate", generate_times), ("recap", recap_times)):
            row = record(request, family, method, statistics.median(times), T1)
            row["repeat_seconds"] = times
            records.append(row)
    recap = summarize(records, ["generate", "recap"])["recap"]
    expected = [(2.0 / 1.0 + 3.0 / 3.0) / 2, (2.2 / 2.0 + 3.0 / 1.5) / 2, (1.8 / 1.2 + 3.3 / 1.1) / 2]
    assert recap["speedup_rounds"] == pytest.approx(expected)
    assert summarize(records, ["generate", "recap"])["generate"]["speedup_rounds"] is None
    results = aggregate(records, ["generate", "recap"])
    results.update(costs=None, mismatches=[], failures=[])
    results["settings"] = synthetic_results([])["settings"] | {"repeats": 3}
    text = markdown(results)
    overall = next(line for line in text.splitlines() if line.startswith("| recap |")).strip("| ").split(" | ")
    assert overall[7] == f"{min(expected):.2f}-{max(expected):.2f}"
    assert "*rounds*" in text
    records[-1]["repeat_seconds"] = [1.0, 1.0]  # rounds that do not line up: no spread rather than a wrong one
    assert summarize(records, ["generate", "recap"])["recap"]["speedup_rounds"] is None
    del records[-1]["repeat_seconds"]
    assert summarize(records, ["generate", "recap"])["recap"]["speedup_rounds"] is None


def test_cpu_steal_is_read_from_proc_stat_and_shown_in_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from recap.bench import run as bench_run

    lines = iter(["cpu  100 0 50 800 10 0 0 40 0 0\n", "cpu  160 0 80 900 10 0 0 100 0 0\n"])

    def fake_open(path: str, *args: Any, **kwargs: Any) -> io.StringIO:
        assert path == "/proc/stat"
        return io.StringIO(next(lines))

    monkeypatch.setattr(bench_run, "open", fake_open, raising=False)
    start, end = bench_run.cpu_times(), bench_run.cpu_times()
    assert start == (40, 1000) and end == (100, 1250)
    assert bench_run.steal_share(start, end) == pytest.approx(60 / 250)
    assert bench_run.steal_share(None, end) is None and bench_run.steal_share(end, end) is None

    results = synthetic_results([])
    assert "CPU steal" not in markdown(results)  # not measured (not Linux): nothing said
    results["settings"]["cpu_steal"] = 0.01
    assert "CPU steal 1% of the run's CPU time" in markdown(results) and "noisy" not in markdown(results)
    results["settings"]["cpu_steal"] = 0.24
    assert "CPU steal 24% of the run's CPU time (noisy timings)" in markdown(results)


def test_markdown_mismatches() -> None:
    text = markdown(synthetic_results([{"method": "recap", "request": "r2", "detail": "first difference at token 5"}]))
    assert "## MISMATCHES" in text
    assert "- recap on r2: first difference at token 5" in text


# -- end to end ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("memory", ["warm", "cold"])
def test_run_bench_end_to_end(memory: str, tmp_path: Path) -> None:
    model, processor = tiny_models.build("llava_next")
    requests = suite_requests("ocr,chart", 1, 0)
    specs = parse_methods("ar,pld,token_recycling,recap")
    names = [s.name for s in specs]
    assert names == ["generate", "ar", "pld", "token_recycling", "recap"]
    results = run_bench(
        model,
        processor,
        requests,
        specs,
        max_new_tokens=24,
        memory=memory,
        warmup=requests[0] if memory == "warm" else None,
        settings={"model": "tiny-llava-next", "device": "cpu", "dtype": "float32", "workload": "suite ocr,chart"},
        progress=False,
    )
    assert results["mismatches"] == []
    records = results["samples"]
    assert len(records) == len(requests) * len(specs)
    assert all(r["match"] for r in records)
    for request in requests:
        hashes = {r["hash"] for r in records if r["request"] == request.id}
        assert len(hashes) == 1
    assert set(results["overall"]) == set(names)
    assert set(results["families"]) == {"ocr", "chart"}
    for summaries in [results["overall"], *results["families"].values()]:
        for method in names:
            summary = summaries[method]
            for key in CONTRACT_KEYS:
                assert key in summary, (method, key)
            assert summary["match_ratio"] == 1.0
            if method == REFERENCE:
                assert summary["mean_accepted_length"] is None
            else:
                assert summary["mean_accepted_length"] >= 1.0
    assert results["overall"]["recap"]["samples"] == 2
    assert results["families"]["ocr"]["recap"]["samples"] == 1
    settings = results["settings"]
    assert settings["memory"] == memory and settings["max_new_tokens"] == 24 and settings["requests"] == 2
    assert settings["methods"] == names and settings["model"] == "tiny-llava-next"
    if Path("/proc/stat").exists():  # Linux: the hypervisor's share of the run and of each request
        assert 0 <= settings["cpu_steal"] <= 1
        assert all(r["cpu_steal"] is None or 0 <= r["cpu_steal"] <= 1 for r in records)  # None: no tick passed
    json.dumps(results)  # serializable

    if memory == "warm":
        out = tmp_path / "out"
        write(results, out)
        for name in ("results.json", "report.md", "speedup.png", "accepted_lengths.png"):
            assert (out / name).is_file() and (out / name).stat().st_size > 0, name
        saved = json.loads((out / "results.json").read_text())
        assert set(saved) >= {"overall", "families", "settings", "mismatches", "samples"}
        assert saved["overall"]["recap"]["match_ratio"] == 1.0
        assert "## Family: chart" in (out / "report.md").read_text()
        with Image.open(out / "speedup.png") as image:
            assert image.format == "PNG"


def test_run_bench_sampling_mode_matches_seeded_generate() -> None:
    model, processor = tiny_models.build("qwen2_5_vl")
    requests = suite_requests("describe,ocr", 1, 0)
    specs = parse_methods("ar,token_recycling,recap")
    sampling = {"do_sample": True, "temperature": 0.7}
    results = run_bench(
        model, processor, requests, specs, max_new_tokens=24, sampling=sampling, seed=3, progress=False,
        settings={"model": "tiny", "device": "cpu", "dtype": "float32", "workload": "suite"},
    )  # fmt: skip
    assert results["mismatches"] == [] and all(r["match"] for r in results["samples"])
    assert "temperature=0.7" in results["settings"]["decoding"] and "manual_seed(3" in results["settings"]["decoding"]
    inputs = build_inputs(processor, requests[1].prompt, requests[1].image)
    torch.manual_seed(3 + 1)
    reference = model.generate(**inputs, max_new_tokens=24, **sampling)[0, inputs["input_ids"].shape[1] :].tolist()
    assert [r["tokens"] for r in results["samples"] if r["request"] == requests[1].id][0] == reference
    greedy = run_bench(model, processor, requests[1:], specs[:1], max_new_tokens=24, progress=False, settings={})
    assert greedy["samples"][0]["tokens"] != reference, "the sampled reference should differ from greedy"
    with pytest.raises(ValueError, match="hf-prompt-lookup cannot run in the sampling mode"):
        run_bench(model, processor, requests, parse_methods("hf-prompt-lookup"), sampling=sampling, progress=False)


def test_run_bench_repeats_keep_the_median_run_from_one_memory_state() -> None:
    """With repeats, each method decodes each request that many times from the memory it had before
    the request (the last run on the memory itself, which carries on), and the median-time run is
    recorded; every run's tokens are generate's."""
    from recap import TokenMemory
    from recap.backends.hf import output_vocab_size

    model, processor = tiny_models.build("qwen2_5_vl")
    requests = suite_requests("describe,ocr", 1, 2)
    specs = parse_methods("token_recycling,recap")
    memory = TokenMemory(output_vocab_size(model), k=8, method="recap")
    copies = []
    original_copy = TokenMemory.copy

    def copy(self: TokenMemory) -> TokenMemory:
        out = original_copy(self)
        copies.append((self, out))
        return out

    TokenMemory.copy = copy
    try:
        results = run_bench(
            model, processor, requests, specs, max_new_tokens=24, memory="warm", progress=False,
            preset_memories={"recap": memory}, repeats=3, settings={},
        )  # fmt: skip
    finally:
        TokenMemory.copy = original_copy
    assert results["mismatches"] == []
    records = results["samples"]
    assert len(records) == len(requests) * 3  # one record per request and method
    for record in records:
        assert len(record["repeat_seconds"]) == 3
        assert record["seconds"] == statistics.median(record["repeat_seconds"])
        assert record["match"]
    # two copies per request for each persistent method (recap and token_recycling), none of them the last run's
    assert sum(source is memory for source, _ in copies) == 2 * len(requests)
    assert int(memory.filled.sum()) > 0  # the last run of each request learned into the memory itself
    assert results["settings"]["repeats"] == 3 and "median run kept" in results["settings"]["protocol"]
    with pytest.raises(ValueError, match="repeats"):
        run_bench(model, processor, requests, specs, repeats=0, progress=False)


def test_run_bench_rejects_bad_memory_mode() -> None:
    model, processor = tiny_models.build("llava_next")
    with pytest.raises(ValueError, match="warm"):
        run_bench(model, processor, [], parse_methods("ar"), memory="lukewarm", progress=False)


def test_the_report_gives_the_steps_per_thread_count() -> None:
    from recap.bench.report import threads_line

    line = threads_line({"generate": {"steps_by_threads": None}, "recap": {"steps_by_threads": {"1": 30, "2": 10}}})
    assert line is not None and line.endswith("recap: 1 threads 75%, 2 threads 25%")
    assert threads_line({"generate": {"steps_by_threads": None}}) is None
