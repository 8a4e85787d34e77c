"""Reward-curve figure for a run: one line per series, drawn with matplotlib's Agg backend.

Agg renders to a file without a display, so this works in pods and CI. The figure object is
created directly (no ``pyplot``) so the global pyplot state and its backend stay untouched.
"""

from __future__ import annotations

from pathlib import Path


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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, points in history.items():
        pts = sorted((int(s), float(v)) for s, v in points)
        if pts:
            marker = "." if len(pts) < 50 else None
            ax.plot([s for s, _ in pts], [v for _, v in pts], label=name, marker=marker)
    ax.set_xlabel("step")
    ax.set_ylabel("value")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if any(history.values()):
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
