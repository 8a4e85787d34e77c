"""The pipeline's summary: stage times, evaluation before/after, where to look in MLflow and
Prefect; its markdown rendering for the flow run's artifact and its text table for the terminal.

**Honest numbers.** The evaluations answer the same held-out problems, so each model's gain is
measured pair by pair (:mod:`llmrl.eval.paired`): each model over the one before it (SFT over
the base model, GRPO over SFT) and, with three models, the last over the first (GRPO over the
base model), each with its paired bootstrap 95% interval and exact McNemar p-value. A gain is
real when its interval excludes 0. Evaluations that did not record which problems they got
right (stage results stored before they did) get a gain without an interval, and a note.

The held-out table, the same in the terminal, the markdown artifact and the parent run's
``pipeline_summary.md`` (here with the arithmetic task's operators as problem kinds)::

    Held-out accuracy
      model       accuracy  problems  gain vs previous [95% CI]  McNemar p      *      +      -
      base model     0.000       200  -                                  -   0/78   0/52   0/70
      after SFT      0.275       200  +0.275 [+0.215, +0.340]       <0.001  23/78   9/52  23/70
      after GRPO     0.435       200  +0.160 [+0.105, +0.215]       <0.001  36/78  18/52  33/70
      after GRPO vs base model: +0.435 [+0.370, +0.505], McNemar p<0.001

followed by a legend (what the gain, the interval and p mean).
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.stages import RUN_ORDER, SPECS, TITLES
from llmrl.eval.paired import CONFIDENCE, RESAMPLES, paired_gain
from llmrl.tracking.pipeline_run import accuracy_key, gain_key

if TYPE_CHECKING:
    from flows.params import PipelineParams
    from llmrl.tracking import PipelineRun

GAIN_HEADER = f"gain vs previous [{CONFIDENCE:.0%} CI]"
"""The header of the gain column of the held-out table."""
P_HEADER = "McNemar p"
"""The header of the McNemar p-value column."""
NO_OUTCOMES = "no per-problem results to pair (evaluated before they were recorded)"
"""The note of a gain without interval because an evaluation has no per-problem outcomes."""
LEGEND = (
    "gain: accuracy difference on the same problems. "
    f"[{CONFIDENCE:.0%} CI]: paired bootstrap over the problems ({RESAMPLES:,} resamples); "
    "the gain is real when the interval excludes 0. "
    "McNemar p: exact test of problems fixed vs broken."
)
KIND_LEGEND = "Per-kind columns: correct/total greedy answers per problem kind."


def build_summary(
    params: PipelineParams, tracking: PipelineRun, records: Mapping[str, dict], run_name: str
) -> dict[str, Any]:
    """The pipeline's result: stages, evaluation rows, parent-run metrics, where to look."""
    stages = [
        {
            "name": name,
            "status": record.get("status", "ran"),
            "seconds": round(float(record.get("seconds") or 0.0), 1),
            "summary": record.get("summary", {}),
            "mlflow_run_id": record.get("mlflow_run_id"),
            "mlflow_link": tracking.link(record.get("mlflow_run_id")),
        }
        for name in RUN_ORDER
        if (record := records.get(name))
    ]
    evaluation: list[dict[str, Any]] = []
    results: list[tuple[str, Mapping[str, Any]]] = []
    for name in RUN_ORDER:
        model, record = SPECS[name].evaluates, records.get(name)
        if not model or not record:
            continue
        result = record["summary"]
        row = {
            "model": model,
            "accuracy": result.get("accuracy"),
            "num_problems": result.get("num_problems"),
        }
        row.update({f"pass@{k}": v for k, v in (result.get("pass_at") or {}).items()})
        row["accuracy_by_kind"] = result.get("accuracy_by_kind") or {}
        row["mlflow_run_id"] = record.get("mlflow_run_id")
        evaluation.append(row)
        results.append((model, result))
    gains = compare_models(results)
    metrics = {accuracy_key(row["model"]): row["accuracy"] for row in evaluation}
    metrics.update(gain_metrics(gains))
    metrics.update({f"seconds_{s['name']}": s["seconds"] for s in stages if s["status"] == "ran"})
    return {
        "flow_run": run_name,
        "work_dir": str(Path(params.work_dir).resolve()),
        "mlflow": {
            "tracking_uri": tracking.uri,
            "experiment": tracking.experiment,
            "experiment_id": tracking.experiment_id,
            "parent_run_id": tracking.run_id,
            "parent_link": tracking.link(tracking.run_id),
            "runs_link": tracking.runs_link(),
        },
        "stages": stages,
        "evaluation": evaluation,
        "gains": gains,
        "kinds": sorted({kind for row in evaluation for kind in row["accuracy_by_kind"]}),
        "metrics": {k: float(v) for k, v in metrics.items() if v is not None},
    }


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The summary artifact's markdown."""
    mlflow = summary["mlflow"]
    lines = [
        f"# llmrl pipeline `{summary['flow_run']}`",
        "",
        f"MLflow parent run [{mlflow['parent_run_id']}]({mlflow['parent_link']}) in experiment "
        f"[`{mlflow['experiment']}`]({mlflow['runs_link']}) (`{mlflow['tracking_uri']}`).",
        f"Work dir: `{summary['work_dir']}`.",
        "",
        "## Held-out accuracy",
        "",
    ]
    header, rows = evaluation_table(summary)
    for cells in [header, ["---"] * len(header), *rows]:
        lines.append("| " + " | ".join(map(_markdown_cell, cells)) + " |")
    notes, legend = evaluation_notes(summary)
    lines += ["", *(f"- {note}" for note in notes), *([""] if notes else []), f"_{legend}_"]
    lines += ["", "## Stages", "", "| stage | status | seconds | result | MLflow run |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for stage in summary["stages"]:
        link = (
            f"[{stage['mlflow_run_id'][:8]}]({stage['mlflow_link']})"
            if stage["mlflow_link"]
            else "-"
        )
        status = {"skipped": "skipped (finished in a previous run)"}.get(
            stage["status"], stage["status"]
        )
        lines.append(
            f"| {stage['name']} | {status} | {stage['seconds']:.1f} | "
            f"{_describe(stage['summary'])} | {link} |"
        )
    return "\n".join(lines) + "\n"


def _describe(result: Mapping[str, Any]) -> str:
    """A stage's summary in a table cell: its numbers, then its output path."""
    numbers = [
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in result.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "seconds"
    ]
    path = result.get("final_checkpoint") or result.get("path")
    return ", ".join([*numbers, *([f"`{path}`"] if path else [])]) or "-"


# ------------------------------------------------------------------------ gains between models


def compare_models(results: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The gains between evaluated models, given in order as ``(model, evaluation summary)``:
    each over the one before it (``previous``: True), then, with more than two, the last over
    the first.

    Each gain is a dict: ``before``, ``after``, ``previous``, the fields of
    :class:`~llmrl.eval.paired.PairedGain` (``gain``, ``ci_low``, ``ci_high``, ``p_value``,
    ``improved``, ``regressed``, ...) and ``note``: None, or why there is no interval (an
    evaluation without ``outcomes``, or two evaluations of different problems); then
    ``ci_low``, ``ci_high`` and ``p_value`` are None and ``gain`` is the accuracy difference.
    """
    pairs = [(*pair, True) for pair in itertools.pairwise(results)]
    if len(results) > 2:
        pairs.append((results[0], results[-1], False))
    return [_gain(before, after, previous) for before, after, previous in pairs]


def _gain(
    before: tuple[str, Mapping[str, Any]], after: tuple[str, Mapping[str, Any]], previous: bool
) -> dict[str, Any]:
    (first, old), (second, new) = before, after
    entry: dict[str, Any] = {"before": first, "after": second, "previous": previous}
    if old.get("outcomes") and new.get("outcomes"):
        try:
            paired = paired_gain(old["outcomes"], new["outcomes"], names=(first, second))
            return {**entry, **paired.as_dict(), "note": None}
        except ValueError as error:
            note = str(error)
    else:
        note = NO_OUTCOMES
    accuracies = (old.get("accuracy"), new.get("accuracy"))
    gain = None if None in accuracies else float(accuracies[1]) - float(accuracies[0])
    return {**entry, "gain": gain, "ci_low": None, "ci_high": None, "p_value": None, "note": note}


def gain_metrics(gains: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The parent run's metrics of :func:`compare_models`' gains: ``gain/<after>_over_<before>``
    and, when paired, ``..._ci_low``, ``..._ci_high`` and ``..._p_mcnemar``."""
    metrics: dict[str, float] = {}
    for gain in gains:
        key = gain_key(gain["after"], gain["before"])
        values = {
            key: gain["gain"],
            f"{key}_ci_low": gain["ci_low"],
            f"{key}_ci_high": gain["ci_high"],
            f"{key}_p_mcnemar": gain["p_value"],
        }
        metrics.update({k: float(v) for k, v in values.items() if v is not None})
    return metrics


# ------------------------------------------------------------------------ the held-out table


def format_gain(gain: Mapping[str, Any] | None) -> str:
    """A gain and its interval: ``+0.115 [+0.060, +0.170]``; ``+0.115 (no CI)`` when unpaired,
    ``-`` for none."""
    if gain is None or gain["gain"] is None:
        return "-"
    if gain["ci_low"] is None:
        return f"{gain['gain']:+.3f} (no CI)"
    return f"{gain['gain']:+.3f} [{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}]"


def format_p(gain: Mapping[str, Any] | None) -> str:
    """A McNemar p-value: ``0.125``, ``<0.001``, or ``-`` without one."""
    p = None if gain is None else gain["p_value"]
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def evaluation_table(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The held-out table's header and one row of cells per evaluated model: accuracy, problems,
    pass@k, the gain over the previous model with its interval and McNemar p, then correct/total
    per problem kind."""
    kinds = list(summary.get("kinds") or [])
    passes = list(dict.fromkeys(k for row in summary["evaluation"] for k in row if "@" in k))
    previous = {g["after"]: g for g in summary.get("gains") or [] if g["previous"]}
    header = ["model", "accuracy", "problems", *passes, GAIN_HEADER, P_HEADER, *kinds]
    rows = []
    for row in summary["evaluation"]:
        by_kind = row.get("accuracy_by_kind") or {}
        gain = previous.get(row["model"])
        rows.append(
            [
                TITLES.get(row["model"], row["model"]),
                _number(row["accuracy"]),
                str(row["num_problems"] or "-"),
                *(_number(row.get(k)) for k in passes),
                format_gain(gain),
                format_p(gain),
                *(_counts(by_kind.get(kind)) for kind in kinds),
            ]
        )
    return header, rows


def evaluation_notes(summary: Mapping[str, Any]) -> tuple[list[str], str]:
    """What the held-out table does not show, one line each (the last model's gain over the
    first; why a gain has no interval), and the legend."""
    notes = []
    for gain in summary.get("gains") or []:
        after, before = (TITLES.get(gain[k], gain[k]) for k in ("after", "before"))
        if gain["note"]:
            shown = "" if gain["previous"] or gain["gain"] is None else f"{gain['gain']:+.3f}, "
            notes.append(f"{after} vs {before}: {shown}no interval: {gain['note']}")
        elif not gain["previous"]:
            p = format_p(gain)
            p = p if p.startswith("<") else f"={p}"
            notes.append(f"{after} vs {before}: {format_gain(gain)}, McNemar p{p}")
    legend = LEGEND + (f" {KIND_LEGEND}" if summary.get("kinds") else "")
    return notes, legend


def evaluation_lines(summary: Mapping[str, Any]) -> list[str]:
    """The held-out table as text lines for the terminal, with its notes and legend."""
    header, rows = evaluation_table(summary)
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header))]
    left = {0, header.index(GAIN_HEADER)}

    def line(cells: list[str]) -> str:
        padded = [
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return ("  " + "  ".join(padded)).rstrip()

    notes, legend = evaluation_notes(summary)
    lines = ["Held-out accuracy", line(header), *map(line, rows)]
    lines += [f"  {note}" for note in notes]
    lines += textwrap.wrap(legend, width=98, initial_indent="  ", subsequent_indent="  ")
    return lines


def evaluation_records(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The held-out table as records (the flow run's table artifact): the model's name, its
    row's cells by column, and its MLflow run."""
    header, rows = evaluation_table(summary)
    records = []
    for row, cells in zip(summary["evaluation"], rows, strict=True):
        record = {"model": row["model"], **dict(zip(header[1:], cells[1:], strict=True))}
        records.append({**record, "mlflow_run_id": row["mlflow_run_id"]})
    return records


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _counts(counts: Mapping[str, Any] | None) -> str:
    return "-" if not counts else f"{counts['correct']}/{counts['total']}"


def _markdown_cell(text: str) -> str:
    """``text`` in a markdown table cell: ``|``, ``*`` and ``_`` escaped (kinds like ``+*``)."""
    for char in "\\|*_":
        text = text.replace(char, "\\" + char)
    return text
