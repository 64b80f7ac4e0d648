"""The docs cite only records that are in the repository: every `benchmarks/results/...` path
and every record-like file name (`step-...json`, `quality-...png`, ...) in the docs names a file
of `benchmarks/results/`, which holds a few curated files (at most 30, RESULTS.md included),
each of them cited by RESULTS.md. Raw per-run output goes to the ignored `benchmarks/runs/`: the
default output of every benchmark (the `dlrt bench` commands, `dlrt.bench` modules, the scripts
of benchmarks/), none of which names the results folder."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MAX_FILES = 30

# a character of a cited name: a glob `*` or a brace group `{a,b}` included
_CH = r"(?:[\w.\-*]|\{[\w.\-,]*\})"
# a record's file name: what `dlrt bench ...`, `dlrt.bench.*` and the device scripts write, or
# any name stamped with a date (`...-20261202...`)
RECORD = re.compile(
    rf"(?<![\w.\-/{{}},*])"
    rf"((?:(?:step|accuracy|quant-kernels|peer|sweep|quality|humaneval|moe|kernels|serve)-{_CH}*"
    rf"|{_CH}*-20\d{{6}}{_CH}*)\.(?:jsonl|json|png|log|txt))"
    rf"(?![\w\-])")
# a path into the results folder (`benchmarks/results/X`, or `results/X` from benchmarks/)
RESULTS_PATH = re.compile(r"(?<![\w.\-])(?:benchmarks/)?results/([\w.\-*]+\.[A-Za-z]+)")
# a record named by the tail of its time only (`-060209`): name records in full
SHORT_CITE = re.compile(r"`-\d{6}(?:\.json)?`|/-\d{6}")


def docs() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "README.md",
             RESULTS / "RESULTS.md"]
    found += sorted((ROOT / "examples").glob("*.md"))
    found += sorted((ROOT / "dlrt" / "data").glob("*/README.md"))
    return [p for p in found if p.is_file()]


def kept() -> list[str]:
    return sorted(p.name for p in RESULTS.iterdir() if not p.name.startswith("."))


def cited(text: str) -> set[str]:
    return set(RECORD.findall(text)) | set(RESULTS_PATH.findall(text))


def expand(name: str) -> list[str]:
    """`a-{1,2}-*.json` -> `a-1-*.json`, `a-2-*.json`."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for part in m.group(1).split(",")
            for x in expand(name[:m.start()] + part + name[m.end():])]


def missing(names: set[str], present: list[str]) -> list[str]:
    return sorted(n for n in names if not all(fnmatch.filter(present, x) for x in expand(n)))


def test_the_docs_exist():
    names = {p.relative_to(ROOT).as_posix() for p in docs()}
    assert {"README.md", "ARCHITECTURE.md", "benchmarks/README.md",
            "benchmarks/results/RESULTS.md"} <= names


@pytest.mark.parametrize("doc", docs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cited_record_is_in_the_results_folder(doc):
    text = doc.read_text(encoding="utf-8")
    gone = missing(cited(text), kept())
    assert not gone, (f"{doc.relative_to(ROOT)} cites records that are not in "
                      f"benchmarks/results/: {gone} (copy the record in, or remove the number "
                      "or mark it 'record lost')")
    short = SHORT_CITE.findall(text)
    assert not short, f"{doc.relative_to(ROOT)} names records by a time alone: {short[:5]}"


def test_the_results_folder_is_curated():
    files = kept()
    assert len(files) <= MAX_FILES, (
        f"benchmarks/results/ holds {len(files)} files (at most {MAX_FILES}): raw per-run "
        "output goes to benchmarks/runs/ (ignored)")
    assert "RESULTS.md" in files
    assert all((RESULTS / f).is_file() for f in files), "benchmarks/results/ has a folder"


def test_every_kept_record_is_cited_by_results_md():
    text = (RESULTS / "RESULTS.md").read_text(encoding="utf-8")
    uncited = [f for f in kept() if f != "RESULTS.md" and f not in text]
    assert not uncited, f"records in benchmarks/results/ that RESULTS.md does not cite: {uncited}"


def test_the_raw_output_folder_is_ignored():
    ignore = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "/benchmarks/runs/" in ignore or "benchmarks/runs/" in ignore


def test_every_benchmark_writes_into_the_raw_output_folder(tmp_path, monkeypatch):
    import torch

    from dlrt.bench import quant_kernels
    from dlrt.bench.report import write_json
    from dlrt.entrypoints.cli import build_parser

    bench = next(a for a in build_parser()._subparsers._group_actions
                 if "bench" in a.choices).choices["bench"]
    (commands,) = bench._subparsers._group_actions
    outs = {name: p.get_default("out") for name, p in commands.choices.items()}
    assert outs and outs == dict.fromkeys(commands.choices, "benchmarks/runs")
    assert quant_kernels.build_parser().get_default("out") == "benchmarks/runs"
    monkeypatch.chdir(tmp_path)
    path = write_json("step-x", {}, torch.device("cpu"))
    assert path.parent == Path("benchmarks/runs")


def test_no_benchmark_names_the_results_folder():
    sources = [*(ROOT / "dlrt" / "bench").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
               *(p for p in (ROOT / "benchmarks" / "device").iterdir() if p.is_file())]
    naming = [p.relative_to(ROOT).as_posix() for p in sources
              if "benchmarks/results" in p.read_text(encoding="utf-8")]
    assert len(sources) > 10 and not naming, (
        f"{naming} name benchmarks/results/: benchmarks write into benchmarks/runs/")


def test_the_patterns():
    text = ("`step-SDAR-8B-Chat-20261202-062433.json`, benchmarks/results/RESULTS.md, "
            "`results/sweep-fp8-moe-n4-*.json`, training_record.json, peer-to-peer, "
            "(`quality-default-20261202-033301.png`); `humaneval.jsonl`")
    assert cited(text) == {"step-SDAR-8B-Chat-20261202-062433.json", "RESULTS.md",
                           "sweep-fp8-moe-n4-*.json", "quality-default-20261202-033301.png"}
    assert cited("logs `device-stream-run{1,2}-20261130.log`, `round-profile-x-20261130.json`") \
        == {"device-stream-run{1,2}-20261130.log", "round-profile-x-20261130.json"}
    assert missing({"sweep-a-*.json", "step-b.json"}, ["sweep-a-1.json"]) == ["step-b.json"]
    assert missing({"s-{1,2}.json"}, ["s-1.json"]) == ["s-{1,2}.json"]
    assert missing({"s-{1,2}.json"}, ["s-1.json", "s-2.json"]) == []
    assert SHORT_CITE.findall("`-060209`, `step-x-20261202-060209.json`") == ["`-060209`"]
