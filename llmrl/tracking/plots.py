"""Figures of runs: line panels drawn with matplotlib's Agg backend (a stage's reward curve, the
comparison of several runs).

Agg renders to a file without a display, so this works in pods and CI. The figure object is
created directly (no ``pyplot``) so the global pyplot state and its backend stay untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Panel:
    """One plot of a figure: ``series`` maps a line's label to its ``[(x, y), ...]`` points.

    With ``categories`` the x values are their indices (``0`` is ``categories[0]``) and the axis
    shows their names, e.g. ``("base", "sft", "grpo")``.
    """

    title: str
    series: dict[str, list[tuple[float, float]]]
    xlabel: str = "step"
    ylabel: str = "value"
    categories: tuple[str, ...] = field(default=())


def render_panels(panels: Sequence[Panel], path: str | Path, *, width: float = 7.0) -> Path:
    """Draw ``panels`` side by side as a PNG at ``path`` (``width`` inches each).

    Example::

        render_panels([Panel("reward", {"run a": [(1, 0.1), (2, 0.3)]})], "reward.png")
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * len(panels), 4), dpi=100)
    FigureCanvasAgg(fig)
    for index, panel in enumerate(panels, start=1):
        ax = fig.add_subplot(1, len(panels), index)
        for name, points in panel.series.items():
            pts = sorted((float(x), float(y)) for x, y in points)
            if pts:
                marker = "o" if panel.categories else ("." if len(pts) < 50 else None)
                ax.plot([x for x, _ in pts], [y for _, y in pts], label=name, marker=marker)
        if panel.categories:
            ax.set_xticks(range(len(panel.categories)), list(panel.categories))
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title)
        ax.grid(True, alpha=0.3)
        if any(panel.series.values()):
            ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def render_reward_curve(
    history: dict[str, list[tuple[int, float]]],
    path: str | Path,
    *,
    title: str = "reward",
) -> Path:
    """Draw ``history`` (series name -> ``[(step, value), ...]``) as a PNG at ``path``.

    Example::

        render_reward_curve({"reward/mean": [(0, 0.1), (1, 0.3)]}, "reward_curve.png")
    """
    return render_panels([Panel(title, history)], path)
