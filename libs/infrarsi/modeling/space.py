"""Search space, candidates and the feature encoder.

Owns: typed knobs, optional patches with pairwise conflicts, constraints, the `Candidate` value type with a
canonical key for dedup, enumeration of finite spaces, space-filling sampling that respects constraints, and
the mapping from a candidate to numeric features that the time and memory models regress on.

Must not: do I/O, know about the event log or pydantic. The contract layer converts its models into these
plain dataclasses.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.stats import qmc

KnobValue = int | float | str | bool


# --------------------------------------------------------------------------------------------------- knobs


@dataclass(frozen=True)
class IntRange:
    """Integer knob, every value in [low, high] allowed (``step`` apart)."""

    name: str
    low: int
    high: int
    step: int = 1
    default: int | None = None

    def values(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1, self.step))


@dataclass(frozen=True)
class IntChoice:
    """Integer knob restricted to listed values (e.g. powers of two)."""

    name: str
    choices: tuple[int, ...]
    default: int | None = None

    def values(self) -> tuple[int, ...]:
        return tuple(self.choices)


@dataclass(frozen=True)
class FloatRange:
    """Continuous knob; ``log`` means it is searched and encoded on a log scale."""

    name: str
    low: float
    high: float
    log: bool = False
    default: float | None = None

    def values(self) -> None:
        return None


@dataclass(frozen=True)
class Categorical:
    """Unordered choice. ``default`` (or the first choice) is the baseline level of the encoding."""

    name: str
    choices: tuple[str, ...]
    default: str | None = None
    memory_order: tuple[str, ...] | None = None
    """Choices ordered from least to most peak memory, when that order holds whatever else is set.
    Used to recognise a candidate that dominates a known OOM; None means no such order is known."""

    def values(self) -> tuple[str, ...]:
        return tuple(self.choices)


@dataclass(frozen=True)
class BoolKnob:
    name: str
    default: bool = False

    def values(self) -> tuple[bool, ...]:
        return (False, True)


Knob = IntRange | IntChoice | FloatRange | Categorical | BoolKnob
NumericKnob = IntRange | IntChoice | FloatRange
"""The knobs with a trend column (``FeatureEncoder``)."""

MemoryDirection = Literal[1, -1, 0]
"""+1: a larger value never lowers peak memory; -1: a larger value never raises it; 0: unknown."""


@dataclass(frozen=True)
class Patch:
    """An optional code change, encoded as an include/exclude feature."""

    id: str
    description: str = ""
    conflicts: frozenset[str] = frozenset()
    time_prior: tuple[float, float] | None = None
    """(mean, std) of the effect on log step time, from the patch metadata; None: use the knowledge base."""
    memory_prior: tuple[float, float] | None = None
    """(mean, std) of the effect on log peak memory."""
    invariant_prior: tuple[float, float] = (0.5, 9.5)
    """(violations, passes) pseudo-counts of the Beta prior on P(this patch breaks an invariant)."""
    risk: Literal["low", "medium", "high"] = "low"


@dataclass(frozen=True)
class Constraint:
    """A named predicate over (knob values, patch ids); a candidate is feasible when all hold."""

    name: str
    predicate: Callable[[Mapping[str, KnobValue], frozenset[str]], bool]


# ----------------------------------------------------------------------------------------------- candidate


@dataclass(frozen=True)
class Candidate:
    """Knob vector + patch set. Hashable; ``key`` is canonical across processes (dedup, event ids)."""

    knob_items: tuple[tuple[str, KnobValue], ...]
    patches: frozenset[str] = frozenset()

    @staticmethod
    def of(knobs: Mapping[str, KnobValue], patches: Iterable[str] = ()) -> Candidate:
        return Candidate(tuple(sorted((k, _canonical_value(v)) for k, v in knobs.items())), frozenset(patches))

    @property
    def knobs(self) -> dict[str, KnobValue]:
        return dict(self.knob_items)

    def __getitem__(self, name: str) -> KnobValue:
        for k, v in self.knob_items:
            if k == name:
                return v
        raise KeyError(name)

    @functools.cached_property
    def key(self) -> str:
        return json.dumps({"k": [[k, v] for k, v in self.knob_items], "p": sorted(self.patches)},
                          separators=(",", ":"), sort_keys=True)

    def replace(self, patches: Iterable[str] | None = None, **knobs: KnobValue) -> Candidate:
        merged = self.knobs | knobs
        return Candidate.of(merged, self.patches if patches is None else patches)

    def with_knob(self, name: str, value: KnobValue) -> Candidate:
        """This candidate with one knob, named at run time, set to ``value`` (``replace`` takes literal names)."""
        return Candidate.of(self.knobs | {name: value}, self.patches)

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.knob_items] + [f"+{p}" for p in sorted(self.patches)]
        return " ".join(parts)


def _canonical_value(v: Any) -> KnobValue:
    if isinstance(v, bool | str):
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, int | np.integer):
        return int(v)
    f = float(v)
    return int(f) if f.is_integer() and not isinstance(v, float) else f


# ---------------------------------------------------------------------------------------------------- space


@dataclass(frozen=True, eq=False)
class SearchSpace:
    knobs: tuple[Knob, ...]
    patches: tuple[Patch, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    memory_direction: Mapping[str, MemoryDirection] = field(default_factory=dict)
    """Per numeric/bool knob: how peak memory moves when the value grows, when known for sure."""
    interactions: tuple[tuple[str, str], ...] | None = None
    """Knob/patch name pairs whose product features are encoded; None: all pairs of compact features."""

    def __post_init__(self) -> None:
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate knob names in {names}")

    # ---- lookup
    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)

    def patch(self, pid: str) -> Patch:
        for p in self.patches:
            if p.id == pid:
                return p
        raise KeyError(pid)

    @property
    def is_finite(self) -> bool:
        return all(not isinstance(k, FloatRange) for k in self.knobs)

    def default_candidate(self) -> Candidate:
        vals: dict[str, KnobValue] = {}
        for k in self.knobs:
            if isinstance(k, FloatRange):
                vals[k.name] = k.default if k.default is not None else (k.low + k.high) / 2
            elif k.default is not None:
                vals[k.name] = k.default
            else:
                vals[k.name] = k.values()[0]
        return Candidate.of(vals)

    # ---- feasibility
    def violated(self, c: Candidate) -> list[str]:
        bad: list[str] = []
        kv = c.knobs
        for k in self.knobs:
            if k.name not in kv:
                bad.append(f"missing:{k.name}")
                continue
            v = kv[k.name]
            if isinstance(k, FloatRange):
                if not (k.low <= float(v) <= k.high):
                    bad.append(f"range:{k.name}")
            elif v not in k.values():
                bad.append(f"domain:{k.name}")
        ids = {p.id for p in self.patches}
        for pid in c.patches:
            if pid not in ids:
                bad.append(f"unknown_patch:{pid}")
        for p in self.patches:
            if p.id in c.patches and p.conflicts & c.patches:
                bad.append(f"conflict:{p.id}")
        for con in self.constraints:
            if not con.predicate(kv, c.patches):
                bad.append(con.name)
        return bad

    def is_feasible(self, c: Candidate) -> bool:
        return not self.violated(c)

    # ---- enumeration
    def size_upper_bound(self) -> float:
        n = 1.0
        for k in self.knobs:
            vs = k.values()
            n *= math.inf if vs is None else len(vs)
        return n * 2.0 ** len(self.patches)

    def iter_all(self) -> Iterator[Candidate]:
        """All feasible candidates of a finite space, in a fixed order."""
        if not self.is_finite:
            raise ValueError("space has continuous knobs; use sample()")
        names = [k.name for k in self.knobs]
        value_lists: list[Sequence[KnobValue]] = [k.values() or () for k in self.knobs]  # finite: never ()
        patch_sets = list(_patch_subsets(self.patches))
        for combo in itertools.product(*value_lists):
            kv = dict(zip(names, combo, strict=True))
            for ps in patch_sets:
                if all(con.predicate(kv, ps) for con in self.constraints):
                    yield Candidate.of(kv, ps)

    def enumerate(self, limit: int = 200_000) -> list[Candidate]:
        out: list[Candidate] = []
        for c in self.iter_all():
            out.append(c)
            if len(out) > limit:
                raise ValueError(f"space has more than {limit} feasible candidates")
        return out

    # ---- sampling
    def sample(self, n: int, rng: np.random.Generator, method: Literal["sobol", "random"] = "sobol",
               max_tries: int = 200) -> list[Candidate]:
        """Up to n distinct feasible candidates, space-filling over the knob domains (scrambled Sobol,
        rejection of infeasible points)."""
        out: dict[str, Candidate] = {}
        d = len(self.knobs) + len(self.patches)
        for _ in range(max_tries):
            m = max(8, 2 ** math.ceil(math.log2(max(2 * (n - len(out)), 2))))
            if method == "sobol" and d > 0:
                u = qmc.Sobol(d, scramble=True, seed=rng).random(m)  # (m, d) in [0,1)
            else:
                u = rng.random((m, d))
            for row in u:
                c = self._from_unit(row)
                if c.key not in out and self.is_feasible(c):
                    out[c.key] = c
                    if len(out) >= n:
                        return list(out.values())
        return list(out.values())

    def _from_unit(self, u: np.ndarray) -> Candidate:
        kv: dict[str, KnobValue] = {}
        for i, k in enumerate(self.knobs):
            if isinstance(k, FloatRange):
                if k.log:
                    kv[k.name] = float(math.exp(math.log(k.low) + u[i] * (math.log(k.high) - math.log(k.low))))
                else:
                    kv[k.name] = float(k.low + u[i] * (k.high - k.low))
            else:
                vs = k.values()
                kv[k.name] = vs[min(int(u[i] * len(vs)), len(vs) - 1)]
        ps = frozenset(p.id for j, p in enumerate(self.patches) if u[len(self.knobs) + j] >= 0.5)
        return Candidate.of(kv, ps)

    def neighbours(self, c: Candidate, two_step: bool = True) -> list[Candidate]:
        """Feasible candidates one knob step / one patch toggle away; with two_step also pairs of changes,
        which equality constraints (tp*pp*dp == devices) need to stay feasible."""
        moves: list[tuple[str, Any]] = []
        kv = c.knobs
        for k in self.knobs:
            v = kv[k.name]
            if isinstance(k, FloatRange):
                span = (k.high - k.low) * 0.1
                for nv in (float(v) - span, float(v) + span):
                    if k.low <= nv <= k.high:
                        moves.append((k.name, nv))
            else:
                for other in k.values():
                    if other != v:
                        moves.append((k.name, other))
        for p in self.patches:
            moves.append(("+patch", p.id))

        def apply(base: Candidate, mv: tuple[str, Any]) -> Candidate | None:
            name, val = mv
            if name == "+patch":
                return Candidate.of(base.knobs, base.patches ^ {val})
            return base.with_knob(name, val)

        out: dict[str, Candidate] = {}
        singles = [apply(c, m) for m in moves]
        for s in singles:
            if s is not None and self.is_feasible(s):
                out[s.key] = s
        if two_step:
            for i, m1 in enumerate(moves):
                s1 = singles[i]
                for m2 in moves[i + 1:]:
                    if m2[0] == m1[0] and m1[0] != "+patch":
                        continue
                    s2 = apply(s1, m2) if s1 is not None else None
                    if s2 is not None and s2.key not in out and self.is_feasible(s2):
                        out[s2.key] = s2
        out.pop(c.key, None)
        return list(out.values())


def _patch_subsets(patches: Sequence[Patch]) -> Iterator[frozenset[str]]:
    ids = [p.id for p in patches]
    conflicts = {p.id: p.conflicts for p in patches}
    for r in range(len(ids) + 1):
        for combo in itertools.combinations(ids, r):
            s = frozenset(combo)
            if all(not (conflicts[i] & s) for i in combo):
                yield s


def maximin_select(points: np.ndarray, k: int, start: Sequence[int] = (), rng: np.random.Generator | None = None
                   ) -> list[int]:
    """Greedy maximin design: indices of k rows of ``points`` (n, d), each as far as possible from those already
    chosen (``start`` counts as chosen)."""
    n = points.shape[0]
    chosen = list(start)
    if n == 0 or k <= 0:
        return []
    if not chosen:
        first = int(rng.integers(n)) if rng is not None else 0
        chosen = [first]
        picked = [first]
    else:
        picked = []
    d2 = np.full(n, np.inf)
    for i in chosen:
        d2 = np.minimum(d2, ((points - points[i]) ** 2).sum(axis=1))
    while len(picked) < k and np.isfinite(d2).any() and d2.max() > 0:
        j = int(np.argmax(d2))
        picked.append(j)
        d2 = np.minimum(d2, ((points - points[j]) ** 2).sum(axis=1))
    return picked[:k]


# -------------------------------------------------------------------------------------------------- encoder


@dataclass(frozen=True)
class FeatureSpec:
    """One encoded column: ``name`` is what priors are keyed by (see priors.py)."""

    name: str
    kind: Literal["intercept", "numeric", "level", "bool", "patch", "interaction"]
    knob: str | None = None
    value: KnobValue | None = None
    compact: bool = False
    """Compact columns (one per knob/patch: a numeric trend, a bool, a non-baseline level) enter interactions."""


def _is_pow2_choice(vals: Sequence[int]) -> bool:
    return all(v > 0 and (v & (v - 1)) == 0 for v in vals)


class FeatureEncoder:
    """Candidate -> feature vector.

    Columns: an intercept; per numeric knob a trend column (log2 of value / smallest value for positive
    power-of-two/log knobs, otherwise the value scaled to [0, 1]) plus, for discrete knobs, one indicator per
    value (shrunk deviations from the trend, so a non-monotone effect can be learnt); per categorical one
    indicator per level; per bool and per patch an indicator; and products of pairs of compact columns.
    """

    def __init__(self, space: SearchSpace, interactions: bool = True) -> None:
        self.space = space
        specs: list[FeatureSpec] = [FeatureSpec("intercept", "intercept")]
        self._knob_cols: list[tuple[Knob, list[int]]] = []
        compact_of: dict[str, list[int]] = {}
        for k in space.knobs:
            cols: list[int] = []
            if isinstance(k, IntRange | IntChoice | FloatRange):
                trend_name = f"{k.name}:log2" if self._log_scale(k) else f"{k.name}:lin"
                cols.append(len(specs))
                specs.append(FeatureSpec(trend_name, "numeric", k.name, compact=True))
                compact_of[k.name] = [cols[-1]]
                vs = k.values()
                if vs is not None and len(vs) > 2:
                    for v in vs:
                        cols.append(len(specs))
                        specs.append(FeatureSpec(f"{k.name}={v}", "level", k.name, v))
            elif isinstance(k, Categorical):
                base = k.default if k.default is not None else k.choices[0]
                compact_of[k.name] = []
                for level in k.choices:
                    cols.append(len(specs))
                    specs.append(FeatureSpec(f"{k.name}={level}", "level", k.name, level, compact=(level != base)))
                    if level != base:
                        compact_of[k.name].append(cols[-1])
            else:  # BoolKnob
                cols.append(len(specs))
                specs.append(FeatureSpec(k.name, "bool", k.name, True, compact=True))
                compact_of[k.name] = [cols[-1]]
            self._knob_cols.append((k, cols))
        self._patch_cols: dict[str, int] = {}
        for p in space.patches:
            self._patch_cols[p.id] = len(specs)
            specs.append(FeatureSpec(f"patch:{p.id}", "patch", p.id, True, compact=True))
            compact_of[f"patch:{p.id}"] = [len(specs) - 1]
        self.n_main = len(specs)
        self._pairs: list[tuple[int, int]] = []
        if interactions:
            if space.interactions is None:
                groups = list(compact_of.keys())
                pairs = [(a, b) for i, a in enumerate(groups) for b in groups[i + 1:]]
            else:
                pairs = list(space.interactions)
            for a, b in pairs:
                for ia in compact_of.get(a, []):
                    for ib in compact_of.get(b, []):
                        self._pairs.append((ia, ib))
                        specs.append(FeatureSpec(f"{specs[ia].name}*{specs[ib].name}", "interaction"))
        self.specs: tuple[FeatureSpec, ...] = tuple(specs)
        self.names: tuple[str, ...] = tuple(s.name for s in specs)
        self.index = {n: i for i, n in enumerate(self.names)}

    @staticmethod
    def _log_scale(k: NumericKnob) -> bool:
        if isinstance(k, FloatRange):
            return k.log
        vs = k.values()
        if vs is None or len(vs) < 2 or min(vs) <= 0:
            return False
        return _is_pow2_choice(vs) or max(vs) / min(vs) >= 4

    @property
    def dim(self) -> int:
        return len(self.specs)

    def _trend(self, k: NumericKnob, v: KnobValue) -> float:
        """0 at the knob's smallest value: an interaction column (a product of two trends) is then zero wherever
        either factor is at its low end, instead of acting as a scaled main effect of the other factor (with
        log2(bucket_mb) in 4.6..7.6, ``recompute=none*bucket_mb:log2`` was mostly a second recompute column)."""
        lo: float
        hi: float
        if isinstance(k, FloatRange):
            lo, hi = k.low, k.high
        else:
            vs = k.values()
            lo, hi = min(vs), max(vs)
        if self._log_scale(k):
            return math.log2(float(v)) - math.log2(float(lo))
        return 0.0 if hi == lo else (float(v) - lo) / (hi - lo)

    def trend_span(self, knob: str | None) -> float:
        """Range of a numeric knob's trend column over its domain (log2 of max/min for log-scaled knobs, 1 for
        linear ones); 1 for anything else."""
        if knob is None:
            return 1.0
        k = self.space.knob(knob)
        if not isinstance(k, IntRange | IntChoice | FloatRange):
            return 1.0
        if isinstance(k, FloatRange):
            return math.log2(k.high / k.low) if self._log_scale(k) else 1.0
        vals = [self._trend(k, v) for v in k.values()]
        return max(vals) - min(vals)

    def encode_main(self, c: Candidate) -> np.ndarray:
        x = np.zeros(self.n_main)
        x[0] = 1.0
        kv = c.knobs
        for k, cols in self._knob_cols:
            v = kv[k.name]
            if isinstance(k, IntRange | IntChoice | FloatRange):
                x[cols[0]] = self._trend(k, v)
                for j in cols[1:]:
                    if self.specs[j].value == v:
                        x[j] = 1.0
            elif isinstance(k, Categorical):
                for j in cols:
                    if self.specs[j].value == v:
                        x[j] = 1.0
            else:
                x[cols[0]] = 1.0 if v else 0.0
        for pid in c.patches:
            x[self._patch_cols[pid]] = 1.0
        return x

    def encode(self, c: Candidate) -> np.ndarray:
        row: np.ndarray = self.encode_many([c])[0]
        return row

    def encode_many(self, cs: Sequence[Candidate]) -> np.ndarray:
        main = np.array([self.encode_main(c) for c in cs]).reshape(len(cs), self.n_main)  # (n, m)
        if not self._pairs:
            return main
        ia = np.array([a for a, _ in self._pairs])
        ib = np.array([b for _, b in self._pairs])
        full: np.ndarray = np.concatenate([main, main[:, ia] * main[:, ib]], axis=1)  # (n, m + pairs)
        return full

    def unit_box(self, cs: Sequence[Candidate]) -> np.ndarray:
        """Compact columns scaled to [0, 1] per column: the geometry for space-filling designs."""
        main = np.array([self.encode_main(c) for c in cs]).reshape(len(cs), self.n_main)
        cols = [i for i, s in enumerate(self.specs[: self.n_main]) if s.compact or s.kind == "level"]
        z = main[:, cols]
        lo, hi = z.min(axis=0), z.max(axis=0)
        unit: np.ndarray = (z - lo) / np.where(hi > lo, hi - lo, 1.0)
        return unit
