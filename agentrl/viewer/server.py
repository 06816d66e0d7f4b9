"""Run viewer: the aiohttp application, one handler per page, every page as the files are now.

Pages: runs -> one run (metric plots, steps) -> one step's groups (filters by status and reward)
-> one trajectory (turns and tokens), plus two trajectories side by side. `/api/version`
changes whenever any run writes, and the page script polls it to follow live runs. Files are
parsed once per version (`run_data`); transformers is imported by the first trajectory page,
not at start-up.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from agentrl.rollout.trajectory import Status
from agentrl.viewer import run_data
from agentrl.viewer.plots import run_plots
from agentrl.viewer.token_view import LOW_LOGPROB, run_tokenizer, token_cells

HERE = Path(__file__).resolve().parent
ROOTS = web.AppKey("roots", list[Path])
TEMPLATES = web.AppKey("templates", jinja2.Environment)
ERROR_STATUSES = frozenset(s.value for s in Status if s.is_error)
SUMMARY_KEYS = ("reward/mean", "accuracy", "val/accuracy", "response_length/mean", "timing_s/step")


def create_app(roots: list[Path]) -> web.Application:
    """The viewer over the run dirs (or folders of run dirs) in `roots`."""
    app = web.Application()
    app[ROOTS] = [Path(root) for root in roots]
    app[TEMPLATES] = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    app.router.add_get("/", runs_page)
    app.router.add_get("/api/version", version)
    app.router.add_get("/runs/{run_id}", run_page)
    app.router.add_get("/runs/{run_id}/{split}/{step:\\d+}", step_page)
    app.router.add_get("/runs/{run_id}/{split}/{step:\\d+}/compare", compare_page)
    app.router.add_get("/runs/{run_id}/{split}/{step:\\d+}/{index:\\d+}", trajectory_page)
    app.router.add_static("/static", HERE / "static")
    return app


def _render(request: web.Request, name: str, **context: Any) -> web.Response:
    html = request.app[TEMPLATES].get_template(name).render(**context)
    return web.Response(text=html, content_type="text/html")


def _runs(request: web.Request) -> list[run_data.Run]:
    return run_data.discover_runs(request.app[ROOTS])


def _run(request: web.Request) -> run_data.Run:
    run_id = request.match_info["run_id"]
    for run in _runs(request):
        if run.run_id == run_id:
            return run
    raise web.HTTPNotFound(text=f"no run {run_id!r}; the viewer serves {[r.run_id for r in _runs(request)]}")


def _trajectories(
    request: web.Request,
) -> tuple[run_data.Run, run_data.RolloutFile, tuple[run_data.TrajectoryRecord, ...]]:
    run, split, step = _run(request), request.match_info["split"], int(request.match_info["step"])
    if split not in run_data.SPLITS:
        raise web.HTTPNotFound(text=f"split must be one of {run_data.SPLITS}, got {split!r}")
    rollouts = run_data.rollout_file(run, step, split)
    if rollouts is None:
        raise web.HTTPNotFound(text=f"run {run.run_id} has no {split} rollouts for step {step}")
    return run, rollouts, run_data.read_trajectories(rollouts)


async def version(request: web.Request) -> web.Response:
    runs = _runs(request)
    return web.json_response({"version": "||".join(f"{r.run_id}={run_data.run_version(r)}" for r in runs)})


async def runs_page(request: web.Request) -> web.Response:
    rows = []
    for run in _runs(request):
        metrics, config = run_data.read_metrics(run), run_data.read_config(run)
        last = metrics[-1] if metrics else {}
        rows.append(
            {
                "run": run,
                "env": (config.get("env") or {}).get("id", ""),
                "model": (config.get("model") or {}).get("path", ""),
                "num_steps": len(metrics),
                "last": last,
            }
        )
    return _render(request, "runs.html", rows=rows, keys=SUMMARY_KEYS)


async def run_page(request: web.Request) -> web.Response:
    run = _run(request)
    metrics = run_data.read_metrics(run)
    by_step: dict[int, dict[str, Any]] = {int(m["step"]): {"metrics": m, "splits": []} for m in metrics}
    for rollouts in run_data.rollout_files(run):
        by_step.setdefault(rollouts.step, {"metrics": {}, "splits": []})["splits"].append(rollouts.split)
    steps = [{"step": step, **by_step[step]} for step in sorted(by_step)]
    plots = run_plots(metrics, run_data.read_config(run))
    return _render(request, "run.html", run=run, plots=plots, steps=steps, keys=SUMMARY_KEYS)


def _float_param(request: web.Request, name: str) -> float | None:
    text = request.query.get(name, "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a number (e.g. 0.5), got {text!r}") from None


async def step_page(request: web.Request) -> web.Response:
    run, rollouts, trajectories = _trajectories(request)
    status = request.query.get("status", "")
    if status and status not in {s.value for s in Status}:
        raise web.HTTPBadRequest(text=f"status must be one of {[s.value for s in Status]}, got {status!r}")
    min_reward, max_reward = _float_param(request, "min_reward"), _float_param(request, "max_reward")
    shown = [
        t
        for t in trajectories
        if (not status or t.status == status)
        and (min_reward is None or t.reward >= min_reward)
        and (max_reward is None or t.reward <= max_reward)
    ]
    group_rows = _group_rows(trajectories, shown)
    return _render(
        request,
        "step.html",
        run=run,
        rollouts=rollouts,
        groups=group_rows,
        num_total=len(trajectories),
        num_shown=len(shown),
        statuses=[s.value for s in Status],
        status=status,
        min_reward=request.query.get("min_reward", ""),
        max_reward=request.query.get("max_reward", ""),
    )


def _group_rows(
    trajectories: tuple[run_data.TrajectoryRecord, ...], shown: list[run_data.TrajectoryRecord]
) -> list[dict[str, Any]]:
    """The groups that have a shown member, with the size and mean reward of the whole group.

    Like the advantages, the mean leaves out trajectories with an error status (None when
    every member has one); the filters only choose which rows are listed.
    """
    groups: dict[int, list[run_data.TrajectoryRecord]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.group_id].append(trajectory)
    shown_by_group: dict[int, list[run_data.TrajectoryRecord]] = defaultdict(list)
    for trajectory in shown:
        shown_by_group[trajectory.group_id].append(trajectory)
    rows = []
    for group_id, members in shown_by_group.items():
        scored = [t.reward for t in groups[group_id] if t.status not in ERROR_STATUSES]
        rows.append(
            {
                "group_id": group_id,
                "members": members,
                "size": len(groups[group_id]),
                "num_errors": len(groups[group_id]) - len(scored),
                "mean_reward": statistics.fmean(scored) if scored else None,
            }
        )
    return rows


def _trajectory_view(
    run: run_data.Run, rollouts: run_data.RolloutFile, trajectory: run_data.TrajectoryRecord
) -> dict[str, Any]:
    try:
        record = run_data.read_record(rollouts, trajectory)
    except ValueError as exc:
        raise web.HTTPConflict(text=str(exc)) from None
    tokenizer = run_tokenizer(run.path, run_data.read_config(run))
    return {
        "t": trajectory,
        "record": record,
        "cells": token_cells(record, tokenizer),
        "has_tokenizer": tokenizer is not None,
    }


def _pick(trajectories: tuple[run_data.TrajectoryRecord, ...], index: int) -> run_data.TrajectoryRecord:
    for trajectory in trajectories:
        if trajectory.index == index:
            return trajectory
    raise web.HTTPNotFound(text=f"no trajectory {index} in this dump of {len(trajectories)}")


async def trajectory_page(request: web.Request) -> web.Response:
    run, rollouts, trajectories = _trajectories(request)
    trajectory = _pick(trajectories, int(request.match_info["index"]))
    view = _trajectory_view(run, rollouts, trajectory)
    return _render(request, "trajectory.html", run=run, rollouts=rollouts, views=[view], low=LOW_LOGPROB)


async def compare_page(request: web.Request) -> web.Response:
    run, rollouts, trajectories = _trajectories(request)
    indices = []
    for name in ("a", "b"):
        text = request.query.get(name, "")
        if not text.isdigit():
            raise web.HTTPBadRequest(text=f"compare needs ?a=INDEX&b=INDEX, got {name}={text!r}")
        indices.append(int(text))
    views = [_trajectory_view(run, rollouts, _pick(trajectories, index)) for index in indices]
    return _render(request, "trajectory.html", run=run, rollouts=rollouts, views=views, low=LOW_LOGPROB)
