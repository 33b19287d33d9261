"""A model's answer, checked: what passes the gates every other proposal passes, and what is refused by name.

Owns ``check_proposals``: the JSON answer (``prompts.PROPOSALS_FORMAT``) → ``AgentAnswered``'s
``patches``/``candidates``/``priors``/``refused``. The gates, in order:

- the answer must be one JSON object (a fenced ```json block is accepted): else ``not_json``; fields of the
  wrong type: ``malformed``;
- each diff: the patch library's own checks on a fresh worktree of the golden baseline
  (``workspace.apply_patches``: scope before git sees it, ``git apply --check``, only editable files changed,
  every locked file's init-time hash) — ``scope_violation`` / ``patch_conflict`` / ``locked_file_changed``;
  an accepted diff becomes patch ``llm-<sha256 prefix>`` with the model's description, reason and expected
  time/memory effect (the launcher applies it again, with the same checks, at every trial);
- each candidate: the study's space (``outside_space``: unknown key, value or patch; infeasible) and the
  contract (``contract_violation``);
- each prior: a feature of the encoded space (``unknown_feature``); its std widened by the contract's
  ``agent.prior_weight`` and never narrower than ``MIN_PRIOR_STD``, so measurements overrule it. An
  ``invariant`` prior (P(the setting breaks an invariant of this job)) names a patch, a knob level or a bool
  knob, its probability clamped to [``MIN_RISK``, ``MAX_RISK``]: never so sure that the search may not try
  the setting once, and one run that keeps every invariant clears it.

Reward hacks in scope (skipping optimiser steps, shrinking eval, slowing the probe's clock) are not guessed at
here: they are ordinary in-scope diffs that the invariants catch when they run, as for the library's
``hack-*`` patches. Must not: publish, call the model, or touch the user's checkout.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi import events as ev
from infrarsi.modeling.space import FeatureEncoder
from infrarsi.study.contract import Contract
from infrarsi.study.space import CandidateOutsideSpace, StudySpace
from infrarsi.trial import workspace

MIN_PRIOR_STD = 0.05
"""No model prior is tighter than this (log units): a few trials can always overrule it."""
MAX_PRIOR_MEAN = 2.0
"""|mean| of a prior above this (×7.4) is clamped: no claim that large survives a first measurement anyway."""
MIN_RISK, MAX_RISK = 0.01, 0.9
"""Bounds of a model's P(a setting breaks an invariant): at 0.9 the search still may try it (P(holds) stays
above ``SearchConfig.invariant_exclude``), so a wrong claim of risk can be overruled by a run."""
RISK_KINDS = frozenset({"patch", "level", "bool"})
"""Features an invariant prior may name: the invariant model's items (a patch, ``knob=value``, a bool knob)."""


@dataclass
class Checked:
    """The parts of an answer that passed, and the refusals."""

    candidates: list[ev.AgentKnobProposal] = field(default_factory=list)
    patches: list[ev.AgentPatch] = field(default_factory=list)
    priors: list[ev.AgentPrior] = field(default_factory=list)
    refused: list[ev.AgentRefusal] = field(default_factory=list)

    def refuse(self, kind: ev.AgentRefusalKind, item: str, detail: str) -> None:
        self.refused.append(ev.AgentRefusal(kind=kind, item=item, detail=detail[:500]))


@dataclass(frozen=True)
class GoldenRepo:
    """Where diffs are tried: the study's repo at its golden baseline, and the init-time locked hashes."""

    repo: Path
    baseline_ref: str
    locked: Mapping[str, str]

    @classmethod
    def of(cls, created: ev.StudyCreated) -> GoldenRepo:
        return cls(Path(created.workload_dir), created.baseline_ref, created.locked_files)

    def editable_files(self, contract: Contract, *, max_files: int = 20) -> dict[str, str]:
        """The editable text files at the golden baseline (what the model may diff against), by path."""
        listed = workspace.git(self.repo, "ls-tree", "-r", "-z", "--name-only", self.baseline_ref, check=False)
        paths = [p for p in listed.stdout.split("\0") if p and contract.editable(p)][:max_files]
        files = {}
        for path in paths:
            shown = workspace.git(self.repo, "show", f"{self.baseline_ref}:{path}", check=False)
            if shown.returncode == 0 and "\0" not in shown.stdout:
                files[path] = shown.stdout
        return files


def golden_editable_files(created: ev.StudyCreated, contract: Contract) -> dict[str, str]:
    """``GoldenRepo.editable_files`` of a study; empty when its repo cannot be read here."""
    try:
        return GoldenRepo.of(created).editable_files(contract)
    except (OSError, workspace.WorkspaceError):
        return {}


class NotJSON(ValueError):
    """The answer holds no JSON object."""


def parse_json_object(text: str) -> dict[str, Any]:
    """The answer's JSON object: the whole text, or the first fenced ``json`` block; else ``NotJSON``."""
    candidates = [text.strip()]
    candidates += re.findall(r"```(?:json)?\s*\n(.*?)```", text, flags=re.DOTALL)
    for body in candidates:
        try:
            doc = json.loads(body)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    raise NotJSON(f"no JSON object in the answer: {text[:200]!r}")


def patch_id_of(diff: str) -> str:
    return "llm-" + hashlib.sha256(diff.encode()).hexdigest()[:12]


def check_proposals(text: str, study: StudySpace, golden: GoldenRepo, *, prior_weight: float,
                    max_patches: int) -> Checked:
    """Every part of a proposals answer through its gate (see the module docstring)."""
    out = Checked()
    try:
        doc = parse_json_object(text)
    except NotJSON as exc:
        out.refuse("not_json", "answer", str(exc))
        return out
    diffs = _list(doc, "patches", out)
    if len(diffs) > max_patches:
        out.refuse("malformed", "patches", f"{len(diffs)} diffs, at most {max_patches} are read; the rest ignored")
        diffs = diffs[:max_patches]
    names: dict[str, str] = {}
    for i, item in enumerate(diffs):
        patch = _check_diff(i, item, study, golden, out)
        if patch is not None and patch.patch_id not in {p.patch_id for p in out.patches}:
            out.patches.append(patch)
            names[f"diff:{i}"] = patch.patch_id
    extended = study.with_agent(out.patches)
    for i, item in enumerate(_list(doc, "candidates", out)):
        _check_candidate(i, item, extended, names, out)
    features = {spec.name: spec.kind for spec in FeatureEncoder(extended.space).specs
                if spec.kind not in ("intercept", "interaction")}
    for i, item in enumerate(_list(doc, "priors", out)):
        _check_prior(i, item, features, names, prior_weight, out)
    return out


def _list(doc: dict[str, Any], key: str, out: Checked) -> list[Any]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        out.refuse("malformed", key, f"{key!r} must be a list, got {type(value).__name__}")
        return []
    return value


def _number(item: Mapping[str, Any], key: str, default: float) -> float:
    value = item.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key!r} must be a finite number, got {value!r}")
    return float(value)


def _check_diff(i: int, item: Any, study: StudySpace, golden: GoldenRepo, out: Checked) -> ev.AgentPatch | None:
    name = f"diff {i}"
    if not isinstance(item, dict) or not isinstance(item.get("diff"), str) or not item["diff"].strip():
        out.refuse("malformed", name, "each patch needs a 'diff' (unified diff text) and a 'description'")
        return None
    diff = item["diff"] if item["diff"].endswith("\n") else item["diff"] + "\n"
    try:
        time_effect = _number(item, "expected_time_log_ratio", 0.0)
        memory_effect = _number(item, "expected_memory_log_ratio", 0.0)
        std = _number(item, "std", 0.3)
    except ValueError as exc:
        out.refuse("malformed", name, str(exc))
        return None
    verdict = try_on_golden(diff, study, golden)
    if not verdict.ok:
        kind: ev.AgentRefusalKind = verdict.kind or "scope_violation"
        if verdict.reason.startswith("locked file"):
            kind = "locked_file_changed"
        out.refuse(kind, name, f"{verdict.reason}")
        return None
    return ev.AgentPatch(
        patch_id=patch_id_of(diff), diff=diff, description=str(item.get("description", ""))[:2000],
        files=verdict.files_changed, reason=str(item.get("reason", ""))[:2000],
        expected_time_log_ratio=_clamp(time_effect), expected_memory_log_ratio=_clamp(memory_effect),
        prior_std=max(MIN_PRIOR_STD, abs(std)),
    )


def try_on_golden(diff: str, study: StudySpace, golden: GoldenRepo) -> workspace.PatchResult:
    """``workspace.apply_patches`` of one diff on a throw-away worktree of the golden baseline."""
    scratch = Path(tempfile.mkdtemp(prefix="infrarsi-agent-"))
    try:
        worktree = workspace.materialise(golden.repo, golden.baseline_ref, scratch / "worktree")
        patch = scratch / "agent.patch"
        patch.write_text(diff, errors="surrogateescape")
        try:
            return workspace.apply_patches(worktree, [patch], study.contract.editable, golden.locked)
        finally:
            workspace.remove(worktree)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_candidate(i: int, item: Any, study: StudySpace, names: Mapping[str, str], out: Checked) -> None:
    name = f"candidate {i}"
    if not isinstance(item, dict) or not isinstance(item.get("knobs", {}), dict) \
            or not isinstance(item.get("patches", []), list):
        out.refuse("malformed", name, "each candidate is {'knobs': {launch key: value}, 'patches': [ids], 'reason'}")
        return
    patches = [names.get(str(p), str(p)) for p in item.get("patches", [])]
    event = ev.Candidate(knobs=item.get("knobs", {}), patches=patches)
    problems = study.contract.candidate_problems(event.knobs, event.patches)
    if problems:
        out.refuse("contract_violation", name, "; ".join(problems))
        return
    try:
        model = study.from_event(event)
    except (CandidateOutsideSpace, TypeError, ValueError) as exc:
        out.refuse("outside_space", name, str(exc))
        return
    if not study.space.is_feasible(model):
        out.refuse("outside_space", name, "infeasible: breaks a constraint of the space (a conflict, the batch)")
        return
    out.candidates.append(ev.AgentKnobProposal(candidate=study.to_event(model), reason=str(item.get("reason", ""))[:2000]))


def _check_prior(i: int, item: Any, features: Mapping[str, str], names: Mapping[str, str], weight: float,
                 out: Checked) -> None:
    if not isinstance(item, dict) or not isinstance(item.get("feature"), str):
        out.refuse("malformed", f"prior {i}",
                   "each prior is {'feature', 'target': time|memory|invariant, 'mean', 'std'}")
        return
    feature = item["feature"]
    if feature.startswith("patch:") and feature.removeprefix("patch:") in names:
        feature = "patch:" + names[feature.removeprefix("patch:")]
    name = f"prior {feature}"
    target = item.get("target", "time")
    if target not in ("time", "memory", "invariant"):
        out.refuse("malformed", name, f"target must be time, memory or invariant, got {target!r}")
        return
    if feature not in features:
        out.refuse("unknown_feature", name, f"{feature!r} is not a feature of this study's model")
        return
    if target == "invariant" and features[feature] not in RISK_KINDS:
        out.refuse("unknown_feature", name, f"{feature!r} is a trend, not a setting: an invariant prior names a "
                                            "patch, a knob level (knob=value) or a bool knob")
        return
    try:
        mean, std = _number(item, "mean", 0.0), _number(item, "std", 0.2)
    except ValueError as exc:
        out.refuse("malformed", name, str(exc))
        return
    out.priors.append(prior_from_answer(feature, target, mean, std, weight, str(item.get("reason", ""))[:2000]))


def prior_from_answer(feature: str, target: str, mean: float, std: float, weight: float, reason: str) -> ev.AgentPrior:
    """A model's stated prior as the search will hold it: the mean clamped to ±``MAX_PRIOR_MEAN``, the std
    floored at ``MIN_PRIOR_STD`` and widened by 1/sqrt(``weight``) — a prior that measurements overrule. An
    ``invariant`` prior's mean is a probability, clamped to [``MIN_RISK``, ``MAX_RISK``]."""
    std = max(MIN_PRIOR_STD, abs(std)) / math.sqrt(weight)
    if target == "invariant":
        return ev.AgentPrior(feature=feature, target="invariant", mean=min(MAX_RISK, max(MIN_RISK, mean)), std=std,
                             weight=weight, reason=reason)
    return ev.AgentPrior(feature=feature, target="memory" if target == "memory" else "time", mean=_clamp(mean),
                         std=std, weight=weight, reason=reason)


def _clamp(value: float) -> float:
    return max(-MAX_PRIOR_MEAN, min(MAX_PRIOR_MEAN, value))
