"""Held-out tau along a training run, kept beside the head: ``eval_curve.json`` (the points and
what made them) and ``eval_curve.png`` (tau against the tokens trained on).

    points.append(CurvePoint(step=200, tokens=409_600, tau=2.31, loss=1.92, estimated_tau=2.6))
    write_curve(out_dir, points, about={"data": [...], "config": {...}})
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CURVE_JSON = "eval_curve.json"
CURVE_PNG = "eval_curve.png"


@dataclass(frozen=True, slots=True)
class CurvePoint:
    step: int  # optimizer steps done
    tokens: int  # sequence tokens the head has trained on so far (padding not counted)
    tau: float  # held-out tau measured at this step
    loss: float  # mean training loss over the steps since the previous point
    estimated_tau: float  # teacher-forced estimate at this step's batch


def write_curve(out_dir: str | Path, points: Sequence[CurvePoint], about: dict[str, Any]) -> None:
    """The JSON always; the plot when matplotlib is there (it is optional for training)."""
    out_dir = Path(out_dir)
    record = {**about, "points": [asdict(p) for p in points]}
    (out_dir / CURVE_JSON).write_text(json.dumps(record, indent=2) + "\n")
    if not points:
        return
    try:
        plot_curve(points, out_dir / CURVE_PNG, title=str(about.get("title", "held-out tau")))
    except ImportError:
        logger.info("matplotlib is not installed: %s only", CURVE_JSON)


def read_curve(path: str | Path) -> list[CurvePoint]:
    record = json.loads(Path(path).read_text())
    return [CurvePoint(**point) for point in record.get("points", [])]


def plot_curve(points: Sequence[CurvePoint], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever display the machine has
    from matplotlib import pyplot as plt

    tokens = [p.tokens / 1e6 for p in points]
    figure, axis = plt.subplots(figsize=(7, 4.2))
    axis.plot(tokens, [p.tau for p in points], "o-", label="held-out tau (engine, fixed tree)")
    axis.plot(
        tokens,
        [p.estimated_tau for p in points],
        "--",
        color="grey",
        label="teacher-forced estimate (training batch)",
    )
    axis.set_xlabel("tokens trained on (millions)")
    axis.set_ylabel("tau (tokens per round)")
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
