"""Run viewer: metric curves as inline SVG drawn here, so the page needs no plotting library.

A plot is a few named series of (step, value) points on shared axes, with a tick label at
each end of both axes, a legend in the series' colours, and a tooltip (`<title>`) on every point.
A plot is drawn only for metrics the run logged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT, MARGIN_RIGHT, MARGIN_BOTTOM, MARGIN_TOP, LEGEND_LINE = 420, 220, 10, 28, 12, 14
# Tick labels are 11px: about 7px per character at most, so the left margin fits the longest one.
TICK_CHAR_WIDTH, TICK_GAP, MIN_MARGIN_LEFT = 7, 8, 56

# Metrics the trainer writes as 0 while the loss term they measure is switched off in the run's
# config (metric -> config path of the switch): such a run never measured them.
SWITCHED_OFF_BY = {"actor/kl_loss": ("actor", "use_kl_loss")}


@dataclass(frozen=True)
class PlotSpec:
    """Which metrics share one plot: exact keys, or every key under a prefix."""

    title: str
    keys: tuple[str, ...] = ()
    prefix: str | None = None  # e.g. "timing_s/": one series per key under it
    skip_all_zero: bool = False  # leave out series that never leave 0 (e.g. unused statuses)


PLOTS = (
    PlotSpec("reward", ("reward/mean", "val/reward/mean")),
    PlotSpec("accuracy", ("accuracy", "val/accuracy")),
    PlotSpec("response length (sampled tokens)", ("response_length/mean", "val/response_length/mean")),
    PlotSpec("turns per episode", ("num_turns/mean", "val/num_turns/mean")),
    PlotSpec("statuses (fraction of trajectories)", prefix="rollout/status/", skip_all_zero=True),
    PlotSpec("timings (s)", prefix="timing_s/"),
    PlotSpec("losses", ("actor/pg_loss", "actor/kl_loss")),
    PlotSpec("entropy", ("actor/entropy",)),
    PlotSpec("gradient norm", ("actor/grad_norm",)),
)


def _switched_off(key: str, config: dict[str, Any]) -> bool:
    section, setting = SWITCHED_OFF_BY.get(key, (None, None))
    return section is not None and (config.get(section) or {}).get(setting) is False


def series_for(
    spec: PlotSpec, metrics: list[dict[str, Any]], config: dict[str, Any] | None = None
) -> dict[str, list[tuple[float, float]]]:
    """name -> [(step, value)] for the keys of `spec` that the run logged (and measured)."""
    keys = list(spec.keys)
    if spec.prefix:
        keys += sorted({key for record in metrics for key in record if key.startswith(spec.prefix)})
    series = {}
    for key in keys:
        if _switched_off(key, config or {}):
            continue
        points = [
            (float(record["step"]), float(record[key]))
            for record in metrics
            if isinstance(record.get(key), (int, float)) and math.isfinite(record[key])
        ]
        if points and not (spec.skip_all_zero and all(value == 0 for _, value in points)):
            series[key.removeprefix(spec.prefix or "")] = points
    return series


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_plot(title: str, series: dict[str, list[tuple[float, float]]]) -> str:
    """An SVG line plot; an empty string when there is nothing to draw."""
    points = [p for values in series.values() for p in values]
    if not points:
        return ""
    x_low, x_high = min(p[0] for p in points), max(p[0] for p in points)
    y_low, y_high = min(p[1] for p in points), max(p[1] for p in points)
    if y_low == y_high:  # a flat line still needs a visible range
        y_low, y_high = y_low - 0.5, y_high + 0.5
    y_labels = (_fmt(y_high), _fmt(y_low))
    margin_left = max(MIN_MARGIN_LEFT, TICK_GAP + TICK_CHAR_WIDTH * max(map(len, y_labels)))
    plot_width = WIDTH - margin_left - MARGIN_RIGHT
    plot_height = HEIGHT - MARGIN_BOTTOM - MARGIN_TOP

    def x_of(step: float) -> float:
        return margin_left + (
            plot_width * (step - x_low) / (x_high - x_low) if x_high > x_low else plot_width / 2
        )

    def y_of(value: float) -> float:
        return MARGIN_TOP + plot_height * (1 - (value - y_low) / (y_high - y_low))

    bottom = MARGIN_TOP + plot_height
    height = HEIGHT + LEGEND_LINE * len(series)  # the legend goes under the axis, one line per series
    label_x = margin_left - TICK_GAP // 2
    parts = [
        (
            f'<svg class="plot" role="img" aria-label="{escape(title)}" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">'
        ),
        f'<rect x="{margin_left}" y="{MARGIN_TOP}" width="{plot_width}" height="{plot_height}" class="frame"/>',
        f'<text x="{label_x}" y="{MARGIN_TOP + 10}" text-anchor="end" class="tick">{y_labels[0]}</text>',
        f'<text x="{label_x}" y="{bottom}" text-anchor="end" class="tick">{y_labels[1]}</text>',
        f'<text x="{margin_left}" y="{HEIGHT - 8}" class="tick">step {_fmt(x_low)}</text>',
        f'<text x="{WIDTH - MARGIN_RIGHT}" y="{HEIGHT - 8}" text-anchor="end" class="tick">{_fmt(x_high)}</text>',
    ]
    for number, (name, values) in enumerate(series.items()):
        color = COLORS[number % len(COLORS)]
        coordinates = " ".join(f"{x_of(s):.1f},{y_of(v):.1f}" for s, v in values)
        parts.append(f'<polyline points="{coordinates}" fill="none" stroke="{color}" stroke-width="2"/>')
        for step, value in values:
            parts.append(
                f'<circle cx="{x_of(step):.1f}" cy="{y_of(value):.1f}" r="3" fill="{color}">'
                f"<title>{escape(name)} at step {_fmt(step)}: {_fmt(value)}</title></circle>"
            )
        parts.append(
            f'<text x="{margin_left}" y="{HEIGHT + LEGEND_LINE * number + 4}" fill="{color}" '
            f'class="legend">&#9632; {escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def run_plots(metrics: list[dict[str, Any]], config: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(title, svg) for every plot the run has data for; `config` is the run's config.yaml."""
    plots = []
    for spec in PLOTS:
        svg = line_plot(spec.title, series_for(spec, metrics, config))
        if svg:
            plots.append((spec.title, svg))
    return plots
