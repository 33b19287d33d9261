"""A study's contract as the modeling package sees it: search space, baseline, priors, capacity, and the
two-way mapping between modeling candidates and the event catalog's candidates.

Owns:

- ``StudySpace.from_contract``: contract knobs (``IntKnob``/``FloatKnob``/``ChoiceKnob``/``BoolKnob``, keyed by
  dotted launch keys) → ``modeling.space`` knobs named by the launch key's last component
  (``knobs.micro_batch_size`` → ``micro_batch_size``, so the knowledge base's aliases apply); the global-batch
  constraint; the patch library's metadata (time/memory log-ratio priors, ``conflicts_with``, risk, kind →
  a prior on breaking an invariant); for ``backend.kind: sim`` the scenario's constraints, memory orders and
  the workload shape (``TransformerMeta``) the structured memory model needs;
- the golden baseline as a modeling candidate (every knob at its launch-file value);
- ``to_event`` / ``from_event``: a modeling candidate ↔ ``events.Candidate`` (launch keys that differ from the
  golden launch file + patch ids). The mapping is a bijection on the space, so ``events.Candidate.key()`` is a
  valid dedup key and the empty candidate is the baseline;
- ``prior_source``: where a feature's prior comes from (``knowledge_base``, ``patch_metadata``, ``bank``, ``host``,
  ``flat``);
- ``with_host``: the doctor's measured facts about the host (its native matmul dtypes) laid over the priors;
- ``with_bank``: the priors ``init`` resolved from the experience bank (``StudyCreated.bank``) laid over the
  built-in ones, and ``adapt_event``: another study's candidate (a bank winner) in this study's terms.

Reads the disk only in ``load_study_space`` (the golden launch file and the patch library, both locked by
``init``, and which pairs of the library's patches apply together on the golden baseline: a pair that does not is
never proposed, where before each candidate holding it cost a refused trial); everything else is pure. Must not: publish, change the modeling package's objects, or build a
``Searcher`` (``study.model.build_searcher`` does; ``study.ledger`` pairs a trial's facts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from infrarsi import events as ev
from infrarsi.modeling.adapt import invariant_overrides, prior_overrides, with_priors
from infrarsi.modeling.memory_model import TransformerMeta
from infrarsi.modeling.priors import KnowledgeBase, default_knowledge_base, host_time_priors
from infrarsi.modeling.space import (
    BoolKnob,
    Candidate,
    Categorical,
    Constraint,
    FeatureSpec,
    FloatRange,
    IntChoice,
    IntRange,
    Knob,
    MemoryDirection,
    Patch,
    SearchSpace,
)
from infrarsi.runtime.settings import env_var
from infrarsi.study.contract import (
    BoolKnob as ContractBool,
)
from infrarsi.study.contract import (
    ChoiceKnob,
    Contract,
    ContractError,
    FloatKnob,
    IntKnob,
    PatchInfo,
    get_dotted,
    locked_contract,
)
from infrarsi.study.shape import study_meta, unroled_knobs
from infrarsi.trial.workspace import WorkspaceError, conflicting_pairs

if TYPE_CHECKING:
    from infrarsi.sim.scenarios import Scenario

SIM_SCENARIO_ENV = env_var("sim_scenario")
"""Workload env var naming the simulator scenario, until ``BackendSpec`` has a ``scenario`` field."""

_MEMORY_DIRECTION: dict[str, MemoryDirection] = {
    # canonical knowledge-base names (priors.ALIASES); +1: larger value never lowers peak memory. Only directions
    # that hold whatever else is set belong here: the OOM-domination rule excludes every candidate that moves
    # each knob the "bigger" way from a known OOM, without trying it. ZeRO stage is left out: a real stage 3
    # can use more than stage 2 (its parameter prefetch buffers and allocator fragmentation outweigh the
    # sharding at small data-parallel sizes), and a wrong direction here excluded settings that fit.
    "micro_batch": 1, "tp": -1, "pp": -1, "dp": -1, "ep": -1, "sequence_parallel": -1,
    "flash_attention": -1, "offload_optimizer": -1, "bucket_mb": 1, "capacity_factor": 1,
}
_MEMORY_ORDER: dict[str, tuple[str, ...]] = {
    # least to most peak memory, whatever else is set
    "recompute": ("full", "selective", "none"),
}
_INVARIANT_PRIOR: dict[str, tuple[float, float]] = {
    # Beta pseudo-counts (violations, passes) on P(a patch breaks an invariant), by patch kind / risk
    "reward_hack": (8.0, 2.0),
    "math_change": (3.0, 3.0),
    "high": (1.0, 3.0),
    "medium": (0.7, 9.3),
    "low": (0.5, 9.5),
}


class CandidateOutsideSpace(ValueError):
    """An ``events.Candidate`` that names a launch key, value or patch the study's space does not have."""


@dataclass(frozen=True)
class KnobBinding:
    """One contract knob: its launch key, its modeling name, and how values map between the two."""

    launch_key: str
    name: str
    to_model: Mapping[Any, Any] = field(default_factory=dict)
    """Launch value → modeling value, for knobs encoded as categoricals of strings (float or mixed choices)."""

    def model_value(self, value: Any) -> Any:
        if self.to_model:
            for launch_value, model_value in self.to_model.items():
                if type(launch_value) is type(value) and launch_value == value:
                    return model_value
            raise CandidateOutsideSpace(f"{self.launch_key}: {value!r} is not one of {list(self.to_model)}")
        return value

    def launch_value(self, value: Any) -> Any:
        if self.to_model:
            for launch_value, model_value in self.to_model.items():
                if model_value == value:
                    return launch_value
            raise CandidateOutsideSpace(f"{self.name}: {value!r} has no launch value")
        return value


@dataclass(frozen=True, eq=False)
class StudySpace:
    """Everything the proposer and the modeler need to build a ``Searcher`` for one study."""

    contract: Contract
    space: SearchSpace
    baseline: Candidate
    """The golden launch file as a modeling candidate (no patches)."""
    bindings: tuple[KnobBinding, ...]
    capacity_bytes: float
    kb: KnowledgeBase
    meta: TransformerMeta | None = None
    """Workload shape for the structured memory model: the scenario's for a simulated study; for a real one
    the contract's ``workload.shape`` over the probe's reading (``study.shape``), once every field is known."""
    probed_shape: ev.WorkloadShape | None = None
    """The shape the probe reported with the study's first measured baseline (``with_shape``)."""
    scenario: str | None = None
    """The simulator scenario, when ``backend.kind`` is ``sim``."""
    notes: tuple[str, ...] = ()
    """What the conversion had to assume (a launch file that could not be read, a patch without metadata)."""
    bank_features: frozenset[str] = frozenset()
    """Encoded features whose time prior comes from the experience bank (``with_bank``)."""
    agent_features: frozenset[str] = frozenset()
    """Encoded features whose prior comes from the language model (``with_agent``)."""
    host_dtypes: tuple[str, ...] = ()
    """The matmul dtypes the doctor found the host runs natively (``with_host``); empty: not known."""

    # ---------------------------------------------------------------------------------------- building

    @classmethod
    def from_contract(
        cls,
        contract: Contract,
        *,
        baseline_launch: Mapping[str, Any] | None = None,
        library: Mapping[str, PatchInfo] | None = None,
        capacity_bytes: float | None = None,
        conflicts: Iterable[tuple[str, str]] = (),
    ) -> StudySpace:
        """Pure conversion. ``baseline_launch`` is the golden launch file (``None``: each knob's first value);
        ``library`` the patch library (``None`` or a missing id: a patch with flat priors); ``conflicts``
        pairs of patches that do not apply together (besides the library's ``conflicts_with``): no candidate
        holds both."""
        notes: list[str] = []
        scenario_name = sim_scenario_name(contract)
        scenario = _scenario(scenario_name) if scenario_name else None
        names = _model_names(list(contract.search_space.knobs))
        if baseline_launch is None:
            notes.append("golden launch file not read: knobs without a launch value start at their first value")
        knobs: list[Knob] = []
        bindings: list[KnobBinding] = []
        base_values: dict[str, Any] = {}
        for key, spec in contract.search_space.knobs.items():
            name = names[key]
            found, launch_value = get_dotted(baseline_launch or {}, key)
            knob, binding = _convert_knob(key, name, spec, launch_value if found else None,
                                          scenario.space if scenario is not None else None)
            knobs.append(knob)
            bindings.append(binding)
            first = (knob.low + knob.high) / 2 if isinstance(knob, FloatRange) else knob.values()[0]
            try:
                base_values[name] = binding.model_value(launch_value) if found else first
            except CandidateOutsideSpace:
                notes.append(f"{key}: golden value {launch_value!r} is outside the knob's choices")
                base_values[name] = first

        patches = _convert_patches(contract.search_space.patches, library, notes, conflicts)
        constraints = list(_global_batch_constraints(contract, names, baseline_launch))
        memory_direction: dict[str, MemoryDirection] = {k.name: d for k in knobs
                            if (d := _MEMORY_DIRECTION.get(KnowledgeBase.canonical(k.name), 0)) != 0}
        meta = None
        if scenario is not None:
            constraints += _scenario_constraints(scenario.space, base_values, scenario_defaults(scenario.space))
            memory_direction |= {k: d for k, d in scenario.space.memory_direction.items() if k in base_values}
            meta = scenario.memory_meta()
        space = SearchSpace(knobs=tuple(knobs), patches=tuple(patches), constraints=tuple(constraints),
                            memory_direction=memory_direction)
        device_kind: Literal["cpu", "gpu"] = "cpu" if contract.cluster.accelerator.lower() == "cpu" else "gpu"
        capacity = float(capacity_bytes or contract.cluster.memory_capacity_bytes)
        if scenario is None:
            meta = study_meta(contract, space, base_values, capacity)  # a contract that states the whole shape
        return cls(contract=contract, space=space, baseline=Candidate.of(base_values), bindings=tuple(bindings),
                   capacity_bytes=capacity, kb=default_knowledge_base(device_kind), meta=meta,
                   scenario=scenario_name, notes=tuple(notes))

    def with_shape(self, probed: ev.WorkloadShape, *, baseline_peak_bytes: float | None) -> StudySpace:
        """This study with the shape the probe read from the model (the contract's statement still wins
        field by field) and the workspace calibrated on the baseline's peak: the structural memory formula
        from here on. A simulated study keeps its scenario's shape."""
        if self.scenario is not None:
            return self
        meta = study_meta(self.contract, self.space, self.baseline.knobs, self.capacity_bytes, probed,
                          baseline_peak_bytes=baseline_peak_bytes)
        notes = self.notes
        if meta is not None and (unroled := unroled_knobs(self.space, meta.roles)):
            # named, never guessed: the formula holds these at the golden's memory; the learned models price them
            notes += (f"memory formula: no role for {', '.join(unroled)} (their memory effect is learned from "
                      "the measured peaks)",)
        return dataclasses.replace(self, meta=meta, probed_shape=probed, notes=notes)

    def with_bank(self, resolution: ev.BankResolution | None) -> StudySpace:
        """This study with the priors ``init`` resolved from the experience bank laid over the built-in ones
        (``StudyCreated.bank``): patch priors into the patch metadata, main effects as knowledge-base overrides.
        Pure: the same resolution gives the same space, so the modeler and the proposer agree, replay after
        replay. ``None`` or no priors: this study unchanged."""
        if resolution is None or not (resolution.time_priors or resolution.memory_priors):
            return self

        time = {name: (p.mean, p.std) for name, p in resolution.time_priors.items()}
        memory = {name: (p.mean, p.std) for name, p in resolution.memory_priors.items()}
        space, kb = with_priors(self.space, self.kb, time, memory)
        return dataclasses.replace(self, space=space, kb=kb, bank_features=frozenset(time) | frozenset(memory))

    def with_host(self, native_dtypes: Iterable[str]) -> StudySpace:
        """This study with what the doctor measured of the host (``DoctorCompleted.host_native_dtypes``) laid
        over the knowledge base (``KnowledgeBase.with_host``): a knob whose effect depends on the hardware starts
        from the measured fact. Layered over the bank's and the agent's priors for the same feature too — the
        host is measured, they are carried over from other hosts or guessed. Pure; no dtypes: unchanged."""
        dtypes = tuple(native_dtypes)
        if not dtypes or dtypes == self.host_dtypes:
            return self
        return dataclasses.replace(self, kb=self.kb.with_host(dtypes), host_dtypes=dtypes)

    def with_agent(self, patches: Iterable[ev.AgentPatch] = (), priors: Iterable[ev.AgentPrior] = (), *,
                   trust_model: bool = True) -> StudySpace:
        """This study with the agent's accepted diffs as patches of the study (their ids added to the contract's
        ``search_space.patches``, so every later ``contract_problems`` check knows them) and its priors laid over
        the knowledge base (``AgentPrior.std`` already widened by the contract's ``agent.prior_weight``). Pure,
        so the proposer and the modeler agree. Diffs are medium risk to the invariant model: unreviewed code.
        ``trust_model=False``: the patches without the model's expected effects (flat priors) and none of its
        priors — the study once the measurements overruled the model (``agent.prior_check``)."""
        patches = [p for p in patches if p.patch_id not in {q.id for q in self.space.patches}]
        priors = list(priors) if trust_model else []
        if not patches and not priors:
            return self
        new = tuple(Patch(p.patch_id, description=p.description,
                          time_prior=(p.expected_time_log_ratio, p.prior_std) if trust_model else None,
                          memory_prior=(p.expected_memory_log_ratio, p.prior_std) if trust_model else None,
                          invariant_prior=_INVARIANT_PRIOR["medium"], risk="medium") for p in patches)
        space = dataclasses.replace(self.space, patches=self.space.patches + new)
        contract = self.contract.with_study_patches(p.patch_id for p in patches)
        time, memory = prior_overrides(priors)
        risks = invariant_overrides(priors)
        kb = self.kb
        if time or memory or risks:
            space, kb = with_priors(space, kb, time, memory, risks)
        # the features whose time/memory priors are the model's (an invariant claim changes neither)
        features = frozenset(time) | frozenset(memory) | {f"patch:{p.patch_id}" for p in patches if trust_model}
        return dataclasses.replace(self, contract=contract, space=space, kb=kb,
                                   agent_features=self.agent_features | features)

    # ---------------------------------------------------------------------------------------- candidates

    def binding(self, name_or_key: str) -> KnobBinding:
        for b in self.bindings:
            if name_or_key in (b.launch_key, b.name):
                return b
        raise CandidateOutsideSpace(f"{name_or_key!r} is not a knob of this study")

    def to_event(self, c: Candidate) -> ev.Candidate:
        """Launch keys whose value differs from the golden launch file, and the patch ids (sorted)."""
        base = self.baseline.knobs
        knobs = {}
        for b in self.bindings:
            value = c[b.name]
            if value != base.get(b.name) or type(value) is not type(base.get(b.name)):
                knobs[b.launch_key] = b.launch_value(value)
        return ev.Candidate(knobs=dict(sorted(knobs.items())), patches=sorted(c.patches))

    def from_event(self, c: ev.Candidate) -> Candidate:
        """The modeling candidate of an event candidate (launch keys or modeling names both accepted);
        raises ``CandidateOutsideSpace`` for an unknown key, value or patch."""
        values = self.baseline.knobs
        for key, value in c.knobs.items():
            b = self.binding(key)
            model_value = b.model_value(value)
            knob = self.space.knob(b.name)
            allowed = knob.values()
            if allowed is not None and model_value not in allowed:
                raise CandidateOutsideSpace(f"{key}: {value!r} is not one of {list(allowed)}")
            values[b.name] = model_value
        patch_ids = {p.id for p in self.space.patches}
        unknown = [p for p in c.patches if p not in patch_ids]
        if unknown:
            raise CandidateOutsideSpace(f"patches {unknown} are not in search_space.patches")
        return Candidate.of(values, c.patches)

    def adapt_event(self, c: ev.Candidate) -> ev.Candidate | None:
        """Another study's candidate (launch keys or modeling names) in this study's terms: knobs and patches
        this space lacks are dropped, knobs it leaves out keep this baseline's values; ``None`` when a value is
        outside a knob's domain or the result is infeasible here."""
        known = {key for b in self.bindings for key in (b.launch_key, b.name)}
        patch_ids = {p.id for p in self.space.patches}
        kept = ev.Candidate(knobs={k: v for k, v in c.knobs.items() if k in known},
                            patches=[p for p in c.patches if p in patch_ids])
        try:
            model = self.from_event(kept)
        except CandidateOutsideSpace:
            return None
        if not self.space.is_feasible(model) or self.contract_problems(model):
            return None
        return self.to_event(model)

    def event_key(self, c: Candidate) -> str:
        return self.to_event(c).key()

    def contract_problems(self, c: Candidate) -> list[str]:
        """The contract's own verdict on a candidate (the last guard before a proposal is published)."""
        e = self.to_event(c)
        return self.contract.candidate_problems(e.knobs, e.patches)

    # ---------------------------------------------------------------------------------------- priors

    def prior_source(self, spec: FeatureSpec) -> str:
        """Where the prior of one encoded feature comes from."""
        if self.host_dtypes and KnowledgeBase.canonical(spec.name) in host_time_priors(self.kb.device_kind,
                                                                                        self.host_dtypes):
            return "host"
        if spec.name in self.agent_features:
            return "llm"
        if spec.name in self.bank_features:
            return "bank"
        if spec.kind == "patch":
            patch = self.space.patch(spec.name.removeprefix("patch:"))
            return "patch_metadata" if patch.time_prior is not None else (
                "knowledge_base" if spec.name.removeprefix("patch:") in self.kb.patch_time else "flat")
        if spec.kind in ("intercept", "interaction"):
            return "flat"
        for key in (spec.name, KnowledgeBase.canonical(spec.name)):
            if key in self.kb.time or key in self.kb.memory:
                return "knowledge_base"
        return "flat"



# --------------------------------------------------------------------------------------------------
# Loading from a StudyCreated (the one place that reads the disk)
# --------------------------------------------------------------------------------------------------


def load_study_space(created: ev.StudyCreated) -> StudySpace:
    """``StudySpace`` of a study: the locked contract, its golden launch file and patch library from the
    workload repo. A launch file or library that cannot be read is noted, not fatal (flat priors)."""
    contract = locked_contract(created)
    notes = []
    launch: dict[str, Any] | None = None
    try:
        launch = contract.baseline_launch()
    except (OSError, ValueError) as exc:
        notes.append(f"launch file: {exc}")
    library: dict[str, PatchInfo] | None = None
    if contract.search_space.patches:
        try:
            library = contract.patch_library()
        except (OSError, ContractError) as exc:
            notes.append(f"patch library: {exc}")
    conflicts: list[tuple[str, str]] = []
    wanted = [pid for pid in contract.search_space.patches if pid in (library or {})]
    if library and len(wanted) >= 2:
        try:
            paths = {pid: library[pid].path for pid in wanted}
            conflicts = conflicting_pairs(created.workload_dir, created.baseline_ref, paths)
        except (OSError, ValueError, WorkspaceError) as exc:
            notes.append(f"patch pairs not checked against the golden baseline: {exc}")
        notes += [f"patches {a} and {b} do not apply together on the golden baseline: never proposed together"
                  for a, b in conflicts]
    study = StudySpace.from_contract(contract, baseline_launch=launch, library=library,
                                     capacity_bytes=created.cluster.memory_capacity_bytes or None,
                                     conflicts=conflicts)
    if notes:
        study = dataclasses.replace(study, notes=study.notes + tuple(notes))
    return study


StudyLoader = Callable[[ev.StudyCreated], StudySpace]


def sim_scenario_name(contract: Contract) -> str | None:
    """The simulator scenario of a ``backend.kind: sim`` contract (``backend.scenario`` once the contract has
    it, else the workload env ``INFRARSI_SIM_SCENARIO``); ``None`` for real backends."""
    if contract.backend.kind != "sim":
        return None
    return getattr(contract.backend, "scenario", None) or contract.workload.env.get(SIM_SCENARIO_ENV)


def scenario_defaults(space: SearchSpace) -> dict[str, Any]:
    return space.default_candidate().knobs


# --------------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------------


def _scenario(name: str) -> Scenario:
    from infrarsi.sim.scenarios import get_scenario

    return get_scenario(name)


def _model_names(keys: list[str]) -> dict[str, str]:
    """Launch key → modeling name: the last dotted component, the whole key (dots → ``_``) where two clash.
    Dashes become ``_`` too: a flag ``--batch-size`` is argparse's ``batch_size``, and the priors know that name."""
    short = {k: k.rsplit(".", 1)[-1].replace("-", "_") for k in keys}
    counts: dict[str, int] = {}
    for s in short.values():
        counts[s] = counts.get(s, 0) + 1
    return {k: (s if counts[s] == 1 else k.replace(".", "_").replace("-", "_")) for k, s in short.items()}


def _convert_knob(key: str, name: str, spec: Any, golden: Any, scenario_space: SearchSpace | None
                  ) -> tuple[Knob, KnobBinding]:
    template = None
    if scenario_space is not None:
        try:
            template = scenario_space.knob(name)
        except KeyError:
            template = None
    match spec:
        case IntKnob(choices=choices) if choices is not None:
            default = golden if isinstance(golden, int) and golden in choices else None
            return IntChoice(name, tuple(sorted(choices)), default=default), KnobBinding(key, name)
        case IntKnob(low=low, high=high) if low is not None and high is not None:
            default = golden if isinstance(golden, int) and low <= golden <= high else None
            return IntRange(name, int(low), int(high), default=default), KnobBinding(key, name)
        case FloatKnob(choices=choices) if choices is not None:
            return _categorical(key, name, list(choices), golden, template)
        case FloatKnob(low=f_low, high=f_high, log=log) if f_low is not None and f_high is not None:
            f_default = float(golden) if isinstance(golden, int | float) and f_low <= golden <= f_high else None
            return FloatRange(name, float(f_low), float(f_high), log=log, default=f_default), KnobBinding(key, name)
        case ContractBool():
            return BoolKnob(name, default=bool(golden) if isinstance(golden, bool) else False), KnobBinding(key, name)
        case ChoiceKnob(choices=choices):
            kinds = {type(c) for c in choices}
            if kinds == {bool}:
                return BoolKnob(name, default=bool(golden) if isinstance(golden, bool) else False), KnobBinding(key, name)
            if kinds == {int}:
                ints = [c for c in choices if isinstance(c, int)]  # all of them
                default = golden if isinstance(golden, int) and golden in ints else None
                return IntChoice(name, tuple(sorted(ints)), default=default), KnobBinding(key, name)
            return _categorical(key, name, list(choices), golden, template)
    raise TypeError(f"unsupported knob {key}: {spec!r}")


def _categorical(key: str, name: str, choices: list[Any], golden: Any, template: Knob | None
                 ) -> tuple[Knob, KnobBinding]:
    """Strings stay as they are; other choices become their ``str`` (mapped back on the way out)."""
    mapping = {} if all(isinstance(c, str) for c in choices) else {c: str(c) for c in choices}
    levels = tuple(mapping.get(c, c) if mapping else c for c in choices)
    default = None
    if golden is not None:
        default = next((m for c, m in zip(choices, levels, strict=True) if type(c) is type(golden) and c == golden), None)
    order = None
    if isinstance(template, Categorical) and template.memory_order and set(levels) <= set(template.memory_order):
        order = tuple(v for v in template.memory_order if v in levels)
    elif KnowledgeBase.canonical(name) in _MEMORY_ORDER:
        known = _MEMORY_ORDER[KnowledgeBase.canonical(name)]
        if set(levels) <= set(known):
            order = tuple(v for v in known if v in levels)
    return Categorical(name, levels, default=default, memory_order=order), KnobBinding(key, name, mapping)


def _convert_patches(ids: list[str], library: Mapping[str, PatchInfo] | None, notes: list[str],
                     found: Iterable[tuple[str, str]] = ()) -> list[Patch]:
    infos = {pid: (library or {}).get(pid) for pid in ids}
    conflicts: dict[str, set[str]] = {pid: set() for pid in ids}
    declared = [(pid, other) for pid, info in infos.items() for other in (info.conflicts_with if info else [])]
    for pid, other in [*declared, *found]:
        if pid in conflicts and other in conflicts:
            conflicts[pid].add(other)
            conflicts[other].add(pid)
    out = []
    for pid in ids:
        info = infos[pid]
        if info is None:
            notes.append(f"patch {pid}: no metadata in the library; flat priors")
            out.append(Patch(pid, conflicts=frozenset(conflicts[pid])))
            continue
        invariant = _INVARIANT_PRIOR.get(info.kind) or _INVARIANT_PRIOR[info.risk]
        out.append(Patch(
            pid,
            description=info.description,
            conflicts=frozenset(conflicts[pid]),
            time_prior=(info.time_log_ratio.mean, info.time_log_ratio.std),
            memory_prior=(info.memory_log_ratio.mean, info.memory_log_ratio.std),
            invariant_prior=invariant,
            risk=info.risk,
        ))
    return out


def _global_batch_constraints(contract: Contract, names: Mapping[str, str], golden: Mapping[str, Any] | None
                              ) -> list[Constraint]:
    """The contract's global-batch constraint over the candidate's knobs; the keys it involves that are not
    knobs keep their golden launch value."""
    gb = contract.search_space.constraints.global_batch
    if gb is None or not ({gb.micro_batch_key, *gb.parallel_keys} & set(names)):
        return []
    fixed = {}
    for key in (gb.micro_batch_key, *gb.parallel_keys):
        found, value = get_dotted(golden or {}, key)
        if key not in names and found:
            fixed[key] = value

    def keeps(kv: Mapping[str, Any], _patches: frozenset[str]) -> bool:
        values = fixed | {key: kv[name] for key, name in names.items() if name in kv}
        return gb.problem(values) is None

    dp = f"{gb.devices}/({'·'.join(gb.parallel_keys) or '1'})" if gb.devices is not None else str(gb.data_parallel)
    return [Constraint(f"{gb.micro_batch_key} x data-parallel {dp} divides global batch {gb.size}", keeps)]


def _scenario_constraints(space: SearchSpace, study_values: Mapping[str, Any], defaults: Mapping[str, Any]
                          ) -> list[Constraint]:
    """The scenario's constraints over the study's knobs; knobs the contract leaves out keep the scenario's
    default (the simulator runs them at that value)."""

    def wrap(con: Constraint) -> Constraint:
        def predicate(kv: Mapping[str, Any], patches: frozenset[str]) -> bool:
            return con.predicate({**defaults, **kv}, patches)

        return Constraint(con.name, predicate)

    return [wrap(c) for c in space.constraints]
