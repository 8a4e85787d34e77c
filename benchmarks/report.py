"""Rewrite the "Latest figures" table of ``benchmarks/README.md`` from ``benchmarks/results/``.

Every benchmark script saves its figures to ``results/<benchmark>.json`` (``harness.save_results``:
the machine, each contender's info, medians and peak memory, and every printed ratio with its
target and verdict). This script reads all of them and replaces what lies between the README's
``<!-- results:begin -->`` and ``<!-- results:end -->`` lines with one table row per figure
(benchmark, what, llmrl, peer, ratio, target, verdict), ordered by benchmark (the order of
``make bench``, then ``learning``, ``model_load`` and any other name alphabetically) and within a
benchmark by the order the script printed them, followed by one line per results file: its date,
machine, versions and thread counts. Everything outside the markers is left as it is.

    python benchmarks/report.py                       # make bench runs it last
    python benchmarks/report.py --results DIR --readme FILE
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ORDER = (
    "rollout",
    "grpo_step",
    "grpo_step_packing",
    "overhead",
    "runtime",
    "weight_push",
    "learning",
    "model_load",
)
HEADER = "| benchmark | what | llmrl | peer | ratio | target | verdict |"
VERSIONS = ("torch", "transformers", "trl", "torchrl", "tensordict", "ray")


class ReportError(Exception):
    """A README without its markers, or a results file that cannot be read."""


def load_results(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` of ``directory``, in table order (see the module docstring)."""
    results = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ReportError(f"{path}: not valid JSON ({error})") from error
        if not isinstance(result, dict) or "benchmark" not in result:
            raise ReportError(f"{path}: not a results file (no 'benchmark')")
        results.append(result)

    def rank(result: dict[str, Any]) -> tuple[int, str]:
        name = result["benchmark"]
        return (ORDER.index(name) if name in ORDER else len(ORDER), name)

    return sorted(results, key=rank)


def render(results: list[dict[str, Any]]) -> str:
    """The generated block: the table, then one line per results file."""
    lines = [HEADER, "|---|---|---|---|---|---|---|"]
    for result in results:
        previous = None
        for figure in result.get("figures", []):
            lines.append(_row(_script(result), figure, same=figure["what"] == previous))
            previous = figure["what"]
    if not results:
        lines.append("| (no results files) | | | | | | |")
    lines += [
        "",
        "Results files (`benchmarks/results/`, written by each script; dates, machines):",
        "",
    ]
    lines += [_file_line(result) for result in results]
    return "\n".join(lines)


def update_readme(readme: Path, results_dir: Path) -> str:
    """Replace the block between the markers of ``readme`` with ``render`` of ``results_dir``;
    returns the new README text (also written to ``readme``)."""
    readme = Path(readme)
    text = readme.read_text()
    for marker in (BEGIN, END):
        if text.count(marker) != 1:
            found = "not found" if marker not in text else "found more than once"
            raise ReportError(f"{readme}: marker {marker} {found}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    if END in head:
        raise ReportError(f"{readme}: marker {END} comes before {BEGIN}")
    block = render(load_results(results_dir))
    new = f"{head}{BEGIN}\n{block}\n{END}{tail}"
    readme.write_text(new)
    return new


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _shown(measure: dict[str, Any] | None) -> str:
    if not measure:
        return ""
    if measure.get("text") is not None:
        return str(measure["text"])
    value = measure.get("value")
    return "" if value is None else f"{value:.4g} {measure.get('unit', '')}".strip()


def _script(result: dict[str, Any]) -> str:
    """The script that wrote ``result`` (files before ``script`` was recorded: the name's)."""
    return result.get("script") or f"{result['benchmark']}.py"


def _row(script: str, figure: dict[str, Any], same: bool) -> str:
    peer = figure.get("peer")
    peer_text = f"{peer['name']} {_shown(peer)}".strip() if peer else ""
    ratio = figure.get("ratio_text") or (
        f"{figure['ratio']:.3f}" if figure.get("ratio") is not None else ""
    )
    target, higher = figure.get("target"), figure.get("higher_is_better", True)
    if figure.get("target_text"):
        target_text = figure["target_text"]
    elif target is None:
        target_text = "none"
    else:
        target_text = f"{'>=' if higher else '<='} {target:g}"
    if target is None:
        verdict = "no target"
    elif figure.get("met"):
        verdict = "met"
    else:
        verdict = f"**missed by {figure['gap']:.3f}**"
    if figure.get("note"):
        verdict += f" ({figure['note']})"
    cells = [
        f"`{script}`",
        "same" if same else figure["what"],
        _shown(figure.get("llmrl")),
        peer_text,
        f"**{ratio}**" if ratio else "",
        target_text,
        verdict,
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _date(value: str) -> str:
    try:
        moment = datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return str(value)
    if "T" not in value:  # a date alone (a transcribed run)
        return moment.date().isoformat()
    return moment.strftime("%Y-%m-%d %H:%M")


def _threads(count: int) -> str:
    return f"{count} thread{'' if count == 1 else 's'}"


def _file_line(result: dict[str, Any]) -> str:
    machine = result.get("machine") or {}
    hardware = [machine.get("cpu_model") or "CPU not recorded"]
    if machine.get("logical_cpus"):
        hardware.append(f"{machine['logical_cpus']} logical CPUs")
    if machine.get("memory_total_gib"):
        hardware.append(f"{machine['memory_total_gib']:g} GiB")
    if "gpu" in machine:  # absent: not recorded (a transcribed run)
        hardware.append(f"GPU {machine['gpu']}" if machine["gpu"] else "no GPU")
    system = " ".join(str(machine[k]) for k in ("os", "kernel") if machine.get(k))
    if system:
        hardware.append(system)
    software = [f"Python {machine['python']}"] if machine.get("python") else []
    for name in VERSIONS:
        if machine.get(name):
            threads = machine.get("torch_threads") if name == "torch" else None
            software.append(
                f"{name} {machine[name]}" + (f" ({_threads(threads)})" if threads else "")
            )
    contenders = []
    for name, entry in (result.get("contenders") or {}).items():
        info = (entry or {}).get("info") or {}
        versions = {**{k: info[k] for k in VERSIONS if isinstance(info.get(k), str)}}
        versions.update(info.get("versions") or {})
        extra = [f"{k} {v}" for k, v in versions.items() if v and v != machine.get(k)]
        if info.get("torch_threads"):
            extra.append(_threads(info["torch_threads"]))
        contenders.append(f"{name}" + (f" ({', '.join(extra)})" if extra else ""))
    source = f", {result['source']}" if result.get("source") else ""
    parts = [", ".join(hardware), ", ".join(software) or "versions not recorded"]
    if contenders:
        parts.append("contenders: " + ", ".join(contenders))
    if result.get("command"):
        parts.append(f"command `{result['command']}`")
    return f"- `{_script(result)}`, {_date(result.get('date', '?'))}{source}: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--readme", type=Path, default=HERE / "README.md")
    args = parser.parse_args(argv)
    try:
        update_readme(args.readme, args.results)
    except ReportError as error:
        sys.exit(f"report.py: {error}")
    print(f"{args.readme}: figures table regenerated from {args.results}/*.json")


if __name__ == "__main__":
    main()
