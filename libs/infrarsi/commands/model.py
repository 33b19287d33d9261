"""``infrarsi model STUDY [--json] [--replay]``: what the models have learnt, per knob setting and patch.

Shows, for every knob setting other than the golden one and every patch, the effect on step time and on
peak memory against the baseline — the prior (knowledge base, patch metadata, textbook memory formula) next
to the posterior — from the study's latest ``ModelUpdated``. ``--replay`` (or a study with no
``ModelUpdated`` yet) refits by replaying the study's events through ``study.model.StudyModel`` (the fold the
modeler service runs),
which needs the workload's launch file and patch library on this machine. Effects are log-ratios, shown as
percentages: −20% time is a step 20% shorter.
"""

from __future__ import annotations

import argparse
import math

import msgspec

from infrarsi import events as ev
from infrarsi.commands.study_log import cli_bus, read_study, require_study
from infrarsi.errors import EXIT_FAILED, UserError

SOURCE = "cli.model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--replay", action="store_true", help="refit from the study's events instead of reading ModelUpdated")
    parser.add_argument("--json", action="store_true", help="print the ModelUpdated as JSON")


async def run(args: argparse.Namespace) -> int:
    async with cli_bus(args, SOURCE) as bus:
        events, _ = await read_study(bus, args.study)
    require_study(events, args.study)
    update = None if args.replay else latest_update(events)
    how = "latest ModelUpdated"
    if update is None:
        update = replay_update(events, args.study)
        how = "replayed through the modeler"
    if update is None:
        raise UserError("no trial of this study has finished yet: nothing to model", EXIT_FAILED)
    if args.json:
        print(msgspec.json.encode(update).decode())
    else:
        print("\n".join(render(update, how)))
    return 0


def latest_update(events: list[ev.Event]) -> ev.ModelUpdated | None:
    return next((e.payload for e in reversed(events) if isinstance(e.payload, ev.ModelUpdated)), None)


def replay_update(events: list[ev.Event], study_id: str) -> ev.ModelUpdated | None:
    from infrarsi.study.model import replay_model  # the modeler service's own fold

    return replay_model(events, study_id)


def _pct(log_ratio: float) -> str:
    return f"{math.expm1(log_ratio) * 100:+6.1f}%"


def _band(mean: float, std: float) -> str:
    return f"{_pct(mean)} [{_pct(mean - 2 * std).strip()}, {_pct(mean + 2 * std).strip()}]"


def render(update: ev.ModelUpdated, how: str) -> list[str]:
    lines = [
        f"model of {update.n_trials} trials ({update.n_oom} OOM), {how}; noise σ(log step) = {update.noise_std_log:.4f}",
    ]
    if update.best_candidate_key:
        lines.append(f"best measured candidate {update.best_candidate_key}: predicted step {update.best_predicted_step_s:.4g}s")
    memory = {e.feature: e for e in update.memory_effects}
    header = f"{'setting':28s} {'time prior':>26s} {'time posterior':>26s} {'memory prior':>26s} {'memory posterior':>26s}  source"
    lines += ["", header, "-" * len(header)]
    for t in update.time_effects:
        m = memory.get(t.feature)
        mem = (f"{_band(m.prior_mean, m.prior_std):>26s} {_band(m.post_mean, m.post_std):>26s}" if m is not None
               else f"{'':>26s} {'':>26s}")
        lines.append(f"{t.feature:28s} {_band(t.prior_mean, t.prior_std):>26s} {_band(t.post_mean, t.post_std):>26s} "
                     f"{mem}  {t.source}")
    lines.append("")
    lines.append("effects vs the golden baseline when only that setting changes; [·,·] = ±2σ")
    return lines
