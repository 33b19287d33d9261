"""A synthetic-but-realistic study log, for report tests and for trying the renderers without a cluster.

``synthetic_study`` returns the lifecycle events a small study leaves (StudyCreated, doctor runs and
DoctorCompleted, search trials with every outcome — ok, OOM with a censored peak, crash, timeout, scope and
invariant violations — a ModelUpdated, and a verification driven through the real verifier logic: one
candidate that passes two rounds and one that fails the loss invariant). Numbers are drawn from a seeded
generator. It is labelled synthetic in the study name; nothing here runs a job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from infrarsi import events as ev
from infrarsi.bus import subjects

GIB = 1024**3
PATCH_DIFF = """--- a/model.py
+++ b/model.py
@@ -10,7 +10,7 @@ class Attention(nn.Module):
     def forward(self, x):
-        q = self.q(x); k = self.k(x); v = self.v(x)
+        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
         return self.attend(q, k, v)
"""


def write_workload(root: Path) -> Path:
    """A workload directory with a one-patch library (``patches/fused-qkv.patch``)."""
    (root / "patches").mkdir(parents=True, exist_ok=True)
    (root / "patches" / "fused-qkv.patch").write_text(PATCH_DIFF)
    (root / "patches" / "index.yaml").write_text(
        "patches:\n  - id: fused-qkv\n    description: fuse q/k/v projections\n    files: [model.py]\n"
    )
    return root


def _curve(n_points: int, every: int, scale: float = 1.0, bump_at: int | None = None) -> list[ev.LossPoint]:
    return [
        ev.LossPoint(s, scale * (4.0 * math.exp(-s / 200) + 1.0) + (0.4 if s == bump_at else 0.0))
        for s in range(every, (n_points + 1) * every, every)
    ]


def _measured(key: str, kind: str, t: float, rng, *, steps: int, peak: int, invariants_ok: bool = True,
              bump_at: int | None = None, mfu_scale: float = 0.12) -> ev.TrialMeasured:
    invariants = [
        ev.InvariantResult(name="timing", ok=True, detail="wall within 3%"),
        ev.InvariantResult(name="loss", ok=invariants_ok, detail="ok" if invariants_ok else "loss 9% off at step 40"),
    ]
    return ev.TrialMeasured(
        candidate_key=key, kind=kind, status="ok", steps=steps, warmup_steps=3, step_time_s=t,
        step_time_mad_s=0.01 * t, step_time_with_warmup_s=1.1 * t, tokens_per_s=8192 / t, mfu=mfu_scale * 0.1 / t,
        flops_per_step=1.2e9, phases={"forward": 0.3 * t, "backward": 0.5 * t}, peak_memory_bytes=[peak, int(peak * 0.97)],
        per_rank_step_s=[t, 0.99 * t], stragglers=[], loss_curve=_curve(steps // 10, 10, bump_at=bump_at),
        eval_curve=_curve(2, steps // 2), optimizer_steps=steps, tokens=steps * 8192, invariants=invariants,
        invariants_ok=invariants_ok,
    )


def synthetic_study(study_id: str, workload_dir: Path, *, seed: int = 0, patch: str = "fused-qkv",
                    before_search: Sequence[tuple[object, str | None]] = ()) -> list[ev.Event]:
    """A study's log: init, doctor, ten search trials, a model update and a two-candidate verification.
    ``patch``: the id of the speed-up patch its trials hold (an agent's ``llm-…`` id: not in the library, its
    diff then comes from the ``AgentAnswered`` in ``before_search``: (payload, trial id) pairs logged before the
    search under their owners' names)."""
    from infrarsi_services.verifier.logic import VerifierLogic  # the real decision logic

    rng = np.random.default_rng(seed)
    capacity = 8 * GIB
    events: list[ev.Event] = []

    def add(payload, trial_id=None, source="synthetic"):
        e = ev.make_event(payload, study_id=study_id, source=source, trial_id=trial_id, cluster_id="local")
        events.append(e)
        return e

    contract = {
        "name": "synthetic-gpt", "goal": "faster steps for the tiny GPT (synthetic log)",
        "workload": {"repo": str(workload_dir), "command": ["{python}", "train.py", "--config", "{launch_file}"],
                     "launch_file": "launch/base.yaml", "steps": 60, "verify_steps": 120, "patch_dir": "patches"},
        "cluster": {"id": "local", "accelerator": "cpu", "memory_capacity_bytes": capacity},
        "scope": {"files": ["model.py"], "launch_keys": ["micro_batch_size", "compile"]},
        "search_space": {"knobs": {"micro_batch_size": {"type": "int", "choices": [2, 4, 8, 16]},
                                   "compile": {"type": "bool"}}, "patches": [patch] if patch == "fused-qkv" else []},
        "invariants": {"loss": {"tolerance": 0.02, "mode": "relative", "at": "every_eval"},
                       "steps": True, "tokens": True, "eval": True, "timing_tolerance": 0.1},
        "budget": {"trials": 12, "accelerator_hours": 2.0, "repeats_per_trial": 1},
        "doctor": {"repeats": 5}, "verify": {"top_k": 2, "repeats": 3, "passes_required": 2},
    }
    created = add(ev.StudyCreated(
        name="synthetic-gpt", goal=contract["goal"], contract=contract, contract_sha256="0" * 64,
        workload_dir=str(workload_dir), baseline_ref="1234567890abcdef", locked_files={"train.py": "ab" * 32},
        cluster=ev.ClusterInfo(cluster_id="local", accelerator="cpu", memory_capacity_bytes=capacity),
    ), source="cli.init")
    verifier = VerifierLogic()
    verifier.apply(created)

    base = ev.Candidate()
    base_t = 0.200
    doctor_ids = []
    for i in range(5):
        tid = f"doc{i}"
        doctor_ids.append(tid)
        add(ev.TrialProposed(candidate=base, candidate_key=base.key(), kind="doctor", origin="baseline", repeat=i), tid)
        add(ev.TrialFinished(status="ok", wall_s=20.0, ranks=2, accelerator_s=40.0, peak_memory_bytes=3 * GIB,
                             memory_capacity_bytes=capacity, steps_completed=60), tid)
        add(_measured(base.key(), "doctor", base_t * math.exp(0.02 * rng.standard_normal()), rng, steps=60, peak=3 * GIB), tid)
    add(ev.DoctorCompleted(
        repeats=5, baseline_trial_ids=doctor_ids, step_time_s=base_t, run_to_run_cv=0.02, step_to_step_cv=0.04,
        warmup_steps=3, phase_fractions={"forward": 0.3, "backward": 0.5, "other": 0.2}, per_rank_step_s=[0.2, 0.198],
        stragglers=[], min_detectable_speedup=1.046, repeats_per_trial=2, repeats_for_effect={"1.05": 2, "1.02": 8},
        peak_flops_measured=1.1e11, mfu=0.06,
    ), source="cli.doctor")

    for payload, trial_id in before_search:
        add(payload, trial_id, source=subjects.route(type(payload).__name__).publishers[0])
    # Search: (knobs, patches, outcome, speed factor, peak GiB)
    plan = [
        ({"micro_batch_size": 4}, [], "ok", 0.95, 3.5),
        ({"micro_batch_size": 8}, [], "ok", 0.88, 5.0),
        ({"micro_batch_size": 16}, [], "oom", None, 7.9),
        ({"compile": True}, [], "crash", None, 2.0),
        ({"micro_batch_size": 8}, [patch], "ok", 0.78, 5.1),
        ({"micro_batch_size": 8, "compile": True}, [], "timeout", None, 4.0),
        ({"micro_batch_size": 2}, [], "ok", 1.04, 2.8),
        ({"micro_batch_size": 4}, [patch], "violation", 0.70, 3.6),
        ({"micro_batch_size": 8}, [patch], "ok", 0.79, 5.0),
        ({}, [patch], "scope", None, 0.0),
    ]
    for i, (knobs, patches, outcome, factor, peak_gib) in enumerate(plan):
        tid = f"search{i}"
        cand = ev.Candidate(knobs=knobs, patches=patches)
        add(ev.TrialProposed(candidate=cand, candidate_key=cand.key(), kind="search", origin="ei"), tid)
        status = {"ok": "ok", "violation": "ok", "oom": "oom", "crash": "crash", "timeout": "timeout",
                  "scope": "scope_violation"}[outcome]
        acc = {"ok": 36.0, "violation": 30.0, "oom": 8.0, "crash": 4.0, "timeout": 120.0, "scope": 0.0}[outcome]
        add(ev.TrialFinished(status=status, ranks=2, accelerator_s=acc, wall_s=acc / 2, peak_memory_bytes=int(peak_gib * GIB),
                             censored_peak_bytes=int(peak_gib * GIB) if outcome == "oom" else None,
                             memory_capacity_bytes=capacity, reason="" if status == "ok" else status), tid)
        if factor is not None:
            add(_measured(cand.key(), "search", base_t * factor * math.exp(0.02 * rng.standard_normal()), rng, steps=60,
                          peak=int(peak_gib * GIB), invariants_ok=outcome != "violation",
                          bump_at=40 if outcome == "violation" else None), tid)
    add(ev.ModelUpdated(
        n_trials=10, n_oom=1, fit_seconds=0.02, noise_std_log=0.021,
        time_effects=[ev.Effect(feature="micro_batch_size=8", prior_mean=-0.05, prior_std=0.1, post_mean=-0.12, post_std=0.03),
                      ev.Effect(feature=f"patch:{patch}", prior_mean=-0.03, prior_std=0.05, post_mean=-0.11, post_std=0.02,
                                source="patch_metadata")],
        memory_effects=[ev.Effect(feature="micro_batch_size=8", prior_mean=0.4, prior_std=0.2, post_mean=0.5, post_std=0.05)],
        best_candidate_key=ev.Candidate(knobs={"micro_batch_size": 8}, patches=[patch]).key(), best_predicted_step_s=0.157,
    ), source="modeler")

    # Verify: the winner (passes twice) and a runner-up that diverges mid-curve at the long horizon.
    winner = ev.Candidate(knobs={"micro_batch_size": 8}, patches=[patch])
    loser = ev.Candidate(knobs={"micro_batch_size": 4})
    request = add(ev.VerifyRequested(candidates=[winner, loser], repeats=3, steps=120), source="cli.verify")
    pending = list(verifier.apply(request))
    while pending:
        emission = pending.pop(0)
        events.append(ev.make_event(emission.payload, study_id=study_id, source="verifier", cluster_id="local",
                                    trial_id=emission.trial_id))
        if not isinstance(emission.payload, ev.TrialProposed):
            continue
        p = emission.payload
        is_base = p.origin == "baseline"
        factor = 1.0 if is_base else (0.78 if p.candidate == winner else 0.95)
        t = base_t * factor * math.exp(0.01 * rng.standard_normal())
        fin = add(ev.TrialFinished(status="ok", ranks=2, accelerator_s=72.0 * factor, wall_s=36.0 * factor,
                                   peak_memory_bytes=(5 if not is_base else 3) * GIB, memory_capacity_bytes=capacity,
                                   steps_completed=120), emission.trial_id, source="launcher")
        pending += verifier.apply(fin)
        m = add(_measured(p.candidate_key, "verify", t, rng, steps=120, peak=(5 if not is_base else 3) * GIB,
                          bump_at=60 if (p.candidate == loser) else None), emission.trial_id, source="telemetry")
        pending += verifier.apply(m)
    return events
