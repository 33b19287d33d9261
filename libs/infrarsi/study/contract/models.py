"""The contract's models, one per concern: the workload and how it is measured, the cluster and backend, the
scope, the search space, the invariants, the budget, verification and the agent; ``Contract`` joins them and
answers the questions the rest of InfraRSI asks of it (is this file editable, what does a trial launch).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from infrarsi.events import ClusterInfo
from infrarsi.study import inputs, userfiles
from infrarsi.study.contract.base import StrictModel
from infrarsi.study.contract.knobs import (
    BoolKnob,
    ChoiceKnob,
    Constraints,
    FloatKnob,
    IntKnob,
    Knob,
)
from infrarsi.study.contract.patches import PatchInfo, load_patch_library
from infrarsi.study.contract.repository import (
    file_sha256,
    get_dotted,
    glob_to_regex,
    normalise_rel,
    read_launch,
    set_dotted,
    tracked_files,
)
from infrarsi.study.inputs import DEFAULT_HASH_LIMIT_BYTES
from infrarsi.trial import launch
from infrarsi.trial.joblog import LogPatterns
from infrarsi.trial.launch import KnobsVia, LaunchValueError, SwitchOff
from infrarsi.verdicts.policy import Policy

COMMAND_PLACEHOLDERS = frozenset({"python", "launch_file", "probe_dir"})
"""The only ``{...}`` names allowed in ``workload.command``; the launcher fills them per trial."""

INVARIANT_NAMES = (
    "scope", "work.optimizer_steps", "work.tokens", "work.eval", "loss", "loss.trend", "loss.parity",
    "parity.deterministic", "timing", "checkpoint.restart", "checkpoint.across_change", "downstream",
)
"""Names of ``events.InvariantResult``; a reward-hack patch's ``breaks`` must be one of them."""


@dataclass(frozen=True)
class TrialLaunch:
    """What the launcher starts for one trial (``Contract.trial_launch``)."""

    argv: list[str]
    """The job's command line, one list element per argument (never a shell string)."""
    env: dict[str, str]
    """The workload's environment variables, knob variables included (``knobs_via: env``)."""
    launch_file: dict[str, Any] | None
    """The launch mapping to write for the job (``knobs_via: launch_file``), else ``None``."""


def _strip_flag_dashes(key: str) -> str:
    return key[2:] if key.startswith("--") else key


class LauncherSpec(StrictModel):
    """How the workload's processes are started on each node."""

    kind: Literal["python", "torchrun"] = "python"
    """``python``: one process runs ``command``; ``torchrun``: the launcher wraps it in torchrun."""
    nnodes: int = Field(default=1, ge=1)
    """Nodes per trial."""
    nproc_per_node: int = Field(default=1, ge=1)
    """Processes (ranks) per node; more than 1 requires ``kind: torchrun``."""

    @model_validator(mode="after")
    def _ranks_need_torchrun(self) -> LauncherSpec:
        if self.kind == "python" and (self.nnodes > 1 or self.nproc_per_node > 1):
            raise ValueError("more than one rank needs kind: torchrun")
        return self


class MeasurementSpec(StrictModel):
    """How a trial of the workload is measured."""

    kind: Literal["probe", "coarse"] = "probe"
    """``probe``: the job reports every step through InfraRSI's probe (or a framework callback), and every
    invariant is checked. ``coarse``: the job has no probe; a trial is measured from outside (wall time,
    exit status, peak memory of the process tree, steps counted in its output by ``step_regex``) and the
    invariants that cannot be checked that way are named unchecked, never passed."""
    step_regex: str | None = None
    """``coarse`` only: a Python regular expression searched in each line of the job's output (lines end at
    ``\\n`` or ``\\r``, so progress bars count). A group named ``step`` is the count of steps done (the
    highest seen is the steps completed), ``index`` the zero-based index of the step just done, ``number``
    the step's number counted from 0 or 1 (the first seen says which); with none of them each matching line
    is one step (the rules: ``infrarsi_services.launcher.output``). ``null``: steps are
    not counted (the step time is then the wall time over the horizon, and the step count unchecked)."""
    loss_regex: list[str] = []
    """``coarse`` only: the job's own train-loss patterns (a group named ``loss``), tried on each output line
    before the defaults of ``infrarsi.trial.joblog`` (HF Trainer's ``{'loss': …}``, Lightning's ``loss=…``,
    ``iter N: loss X``, ``step N | loss X``, Megatron's ``lm loss: X``). With a loss read, the loss invariant
    is checked against the baseline's (the trial says the loss came from the log)."""
    eval_loss_regex: list[str] = []
    """``coarse`` only: the job's own eval-loss patterns (a group named ``loss``), before the defaults
    (``{'eval_loss': …}``, ``val_loss=…``, ``val loss X``, Megatron's ``lm loss value: X``)."""
    step_time_regex: list[str] = []
    """``coarse`` only: the job's own printed step-time patterns (a group ``ms``, ``s`` or ``hz``), tried on
    each line that counted a step, before the defaults (``81.2ms``, ``812.3 ms``, ``1.2s/it``, ``2.1it/s``).
    Printed step times are held against the launcher's clock: the timing invariant."""
    tokens_regex: list[str] = []
    """``coarse`` only: the job's own patterns for the training work done so far, before the defaults (HF
    ``Trainer``'s ``'num_input_tokens_seen': N``): a group ``tokens`` (tokens trained so far) or
    ``micro_batches`` (micro-batches run so far, LitGPT's ``iter N``; each is the trial's micro-batch ×
    ``workload.shape.seq_len`` tokens). Without a printed count the tokens are the steps counted × the tokens
    per step the contract states (``steps_key_tokens``, or ``constraints.global_batch.size`` × ``shape.seq_len``);
    with neither, ``work.tokens`` is unchecked and says which to give."""
    log_defaults: bool = True
    """``coarse`` only: also try the default loss, step-time and work patterns (``false``: only the contract's)."""

    @field_validator("step_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("loss_regex", "eval_loss_regex", "step_time_regex", "tokens_regex")
    @classmethod
    def _named_groups(cls, value: list[str], info: ValidationInfo) -> list[str]:
        groups = {"step_time_regex": {"ms", "s", "hz"}, "tokens_regex": {"tokens", "micro_batches"}}.get(
            info.field_name or "", {"loss"})
        for pattern in value:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
            if not groups & set(compiled.groupindex):
                raise ValueError(f"{pattern!r} has no group named {' or '.join(sorted(groups))}, e.g. (?P<{min(groups)}>[0-9.]+)")
        return value

    @model_validator(mode="after")
    def _regex_only_coarse(self) -> MeasurementSpec:
        if self.kind == "probe" and self.step_regex is not None:
            raise ValueError("step_regex is only used with kind: coarse (the probe counts steps itself)")
        if self.kind == "probe" and (self.loss_regex or self.eval_loss_regex or self.step_time_regex or self.tokens_regex):
            raise ValueError("loss_regex, eval_loss_regex, step_time_regex and tokens_regex are only used with kind: "
                             "coarse (the probe reports the loss, step times and tokens itself)")  # fmt: skip
        return self

    def log_patterns(self) -> LogPatterns:
        """The compiled patterns a coarse trial's output is read with."""
        return LogPatterns.build(self.loss_regex, self.eval_loss_regex, self.step_time_regex, self.tokens_regex,
                                 defaults=self.log_defaults)  # fmt: skip


class ShapeSpec(StrictModel):
    """The model's shape, as the contract states it: each field given here overrides what the probe reads
    from the model when it attaches (``infrarsi.probe.shape``); a job without a probe can state it all. With
    layers, hidden, heads, seq_len, vocab and parameters known, the search's memory model is the structural
    formula (``infrarsi.modeling.memory_model``), as for the simulator's scenarios."""

    parameters: int | None = Field(default=None, ge=1)
    """All parameters of the model (one replica, before sharding)."""
    expert_parameters: int | None = Field(default=None, ge=0)
    """Of which in MoE experts."""
    layers: int | None = Field(default=None, ge=1)
    """Transformer blocks."""
    hidden: int | None = Field(default=None, ge=1)
    """Residual width (hidden size)."""
    heads: int | None = Field(default=None, ge=1)
    """Attention heads."""
    seq_len: int | None = Field(default=None, ge=1)
    """Tokens per training sequence."""
    vocab: int | None = Field(default=None, ge=1)
    """Vocabulary size."""
    experts: int | None = Field(default=None, ge=1)
    """MoE experts per layer (unset or 1: dense)."""
    experts_per_token: int | None = Field(default=None, ge=1)
    """MoE experts each token is routed to."""
    workspace_bytes: float | None = Field(default=None, ge=0)
    """Memory besides model state and activations (runtime, allocator, CUDA context). Unset: calibrated on
    the baseline's measured peak once one is measured (1.5 GiB on a GPU, 0.4 GiB on a CPU host until then)."""


class WorkloadSpec(StrictModel):
    """The training job: where it lives and how it is started."""

    repo: Path
    """Directory of the workload, relative to the contract file; stored resolved (absolute)."""
    command: list[str] = Field(min_length=1)
    """The job's argv (no shell). Placeholders: ``{python}``, ``{launch_file}``, ``{probe_dir}``. With
    ``knobs_via: argv`` or ``overrides`` it is also the golden baseline of the knobs' flags or items."""
    knobs_via: KnobsVia = "launch_file"
    """How knob values reach the job: ``launch_file`` (a copy of the golden launch YAML), ``argv``
    (``--flag value`` of the command line), ``env`` (environment variables) or ``overrides``
    (Hydra/OmegaConf-style ``a.b=value`` items of the command line). See ``infrarsi.trial.launch``."""
    launch_file: str | None = None
    """Golden baseline launch YAML, relative to ``repo``; required with (and only with) ``knobs_via:
    launch_file``. Knob values reach the job through a copy of it."""
    argv_switch_off: SwitchOff = "drop"
    """With ``knobs_via: argv``: how a switch-style boolean flag the golden command has no negation for is
    turned off: ``drop`` (left out; the job's default must be off), ``no-`` (``--no-bf16``) or ``no_``
    (``--no_bf16``, Hugging Face's spelling)."""
    launcher: LauncherSpec = LauncherSpec()
    """Process layout of one trial."""
    env: dict[str, str] = {}
    """Extra environment variables for the job (fixed for every trial, baseline included)."""
    steps: int = Field(ge=1)
    """Trial horizon in optimiser steps, written to the launch key ``steps_key``."""
    steps_key: str = "steps"
    """Knob-style key that receives the horizon: a launch key (dotted for nested sections, e.g.
    ``run.steps``), a flag (``max_steps`` or ``--max_steps``), a variable or an override path."""
    steps_key_tokens: int | None = Field(default=None, ge=1)
    """Set when ``steps_key`` counts tokens, not optimiser steps (LitGPT's ``train.max_tokens``): the tokens of
    one optimiser step (global batch × sequence length). A trial of N steps is then given N × this."""
    verify_steps: int = Field(ge=1)
    """Longer horizon used at verify, to catch slow divergence."""
    patch_dir: str = "patches"
    """Patch library, relative to ``repo``: ``index.yaml`` plus one ``<id>.patch`` per patch."""
    shape: ShapeSpec | None = None
    """The model's shape, stated or overriding the probe's reading (``ShapeSpec``)."""
    measurement: MeasurementSpec = MeasurementSpec()
    """How trials are measured: through the probe (default) or coarsely from outside."""
    inputs: list[str] = []
    """What the job reads that git does not track (datasets, tokenizers, prepared shards: untracked or
    ignored files and directories), relative to ``repo``. Each is present in every trial worktree as a
    symbolic link to this copy (read-only: a trial that changes one is refused), and locked at ``init``
    (``StudyCreated.locked_inputs``): data that changed since is refused before the trial runs, as a
    ``data_change`` (``infrarsi.study.inputs``). ``infrarsi scaffold`` lists the candidates it finds."""
    inputs_hash_limit_bytes: int = Field(default=DEFAULT_HASH_LIMIT_BYTES, ge=0)
    """Input files up to this size are locked by their sha256; larger ones by size and modification time."""

    @field_validator("repo", mode="after")
    @classmethod
    def _resolve_repo(cls, value: Path, info: ValidationInfo) -> Path:
        base = (info.context or {}).get("base_dir")
        if not value.is_absolute():
            value = Path(base or ".") / value
        return value.resolve()

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _verify_not_shorter(self) -> WorkloadSpec:
        if self.verify_steps < self.steps:
            raise ValueError(f"verify_steps ({self.verify_steps}) must be at least steps ({self.steps})")
        return self

    @model_validator(mode="after")
    def _launch_file_iff_file_delivery(self) -> WorkloadSpec:
        if self.knobs_via == "launch_file" and self.launch_file is None:
            raise ValueError("launch_file is required with knobs_via: launch_file")
        if self.knobs_via != "launch_file" and self.launch_file is not None:
            raise ValueError(f"launch_file is only used with knobs_via: launch_file (this workload: {self.knobs_via})")
        return self


class ClusterSpec(StrictModel):
    """Where trials run; also what bank entries are matched on."""

    id: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    """Cluster id (a NATS subject token: letters, digits, ``-``, ``_``)."""
    accelerator: str
    """Accelerator SKU, e.g. ``cpu``, ``A100-80G``, ``H100-80G``."""
    nodes: int = Field(default=1, ge=1)
    """Nodes available."""
    devices_per_node: int = Field(default=1, ge=1)
    """Accelerators per node."""
    memory_capacity_bytes: int = Field(ge=1)
    """Memory per device; on a CPU host an emulated capacity enforced by the launcher's watchdog."""
    peak_flops: float | None = Field(default=None, gt=0)
    """Peak FLOP/s per device; ``null`` until doctor measures it (CPU hosts)."""
    interconnect: str = "loopback"
    """E.g. ``loopback``, ``nvlink``, ``infiniband``."""

    def info(self) -> ClusterInfo:
        """As the event catalog's ``ClusterInfo``."""
        return ClusterInfo(
            cluster_id=self.id,
            accelerator=self.accelerator,
            nodes=self.nodes,
            devices_per_node=self.devices_per_node,
            memory_capacity_bytes=self.memory_capacity_bytes,
            peak_flops=self.peak_flops,
            interconnect=self.interconnect,
        )


def _pattern(pattern: re.Pattern[str] | str, what: str) -> AfterValidator:
    """A string field's check: the whole value matches ``pattern``, else ``'<value>' is not <what>``."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


_SLURM_TOKEN = re.compile(r"[A-Za-z0-9_.:@+=/,\-]+")
SlurmToken = Annotated[str, _pattern(_SLURM_TOKEN, "a single Slurm token (letters, digits, _.:@+=/,-)")]
"""A Slurm option value: one token, no spaces, quotes or shell characters (it reaches sbatch as one argv item)."""
SlurmTime = Annotated[str, _pattern(r"(\d+-)?\d+(:\d{1,2}){0,2}", "a Slurm time (minutes, hh:mm:ss or d-hh:mm:ss)")]
"""``minutes``, ``mm:ss``, ``hh:mm:ss``, ``d-hh[:mm[:ss]]``."""
KubernetesName = Annotated[str, _pattern(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
                                         "a Kubernetes name (lower-case letters, digits and '-', 63 at most)")]
"""A Kubernetes namespace, claim or service-account name (RFC 1123 label)."""
NetnsName = Annotated[str, _pattern(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", "a network namespace name")]
_SBATCH_OWNED = ("--parsable", "--wrap", "--output", "--error", "--job-name", "--chdir", "--nodes", "--ntasks",
                 "--ntasks-per-node", "--comment", "--requeue", "--no-requeue", "--export")
"""sbatch options the Slurm backend sets itself: ``extra_sbatch`` may not override them."""
SLURM_FIELDS = ("partition", "account", "qos", "time_limit", "gres", "constraint", "exclusive", "extra_sbatch")
KUBERNETES_FIELDS = ("namespace", "image", "manifest", "gpus_per_node", "volume_claim", "service_account",
                     "kubeconfig", "image_python")


class BackendSpec(StrictModel):
    """How the launcher runs trials."""

    kind: Literal["local", "sim", "slurm", "kubernetes"] = "local"
    """``local``: subprocesses on this host; ``sim``: the analytic cluster simulator (labelled as such);
    ``slurm``: a batch job per trial (``sbatch``); ``kubernetes``: a ``PyTorchJob`` (or an indexed ``Job`` and
    a headless ``Service``) per trial — untested against a live cluster (``docs/backends.md``)."""
    parallel: int = Field(default=1, ge=1)
    """Trials in flight at once."""
    timeout_s: float = Field(default=600.0, gt=0)
    """A trial running longer is killed and reported ``timeout``."""
    scenario: str | None = None
    """For ``kind: sim``: the simulator scenario (see ``infrarsi.sim.scenarios``); ignored otherwise."""
    netns: list[NetnsName] = []
    """For ``kind: local``: run node ``i``'s torchrun agent inside network namespace ``netns[i]`` (an emulated
    host with its own address; ``infrarsi.trial.netns``), the rendezvous on the first one's address."""
    isolation: Literal["auto", "sandbox", "none"] = "auto"
    """For ``kind: local`` and ``kind: slurm``: how a trial's job is kept from the rest of its host
    (docs/security.md, "Trials are untrusted"). ``sandbox``: in bubblewrap — it sees its worktree, its probe
    directory, its read-only inputs and a private ``/tmp``, holds no secret, and a one-node job has no network; a
    host (for Slurm: a node) without a working ``bwrap`` refuses the trial (``crash``, naming why). ``auto``: the
    sandbox where the launcher's host has it (Slurm nodes are taken to be the same install), else none. ``none``:
    the job runs as the launcher's user and can read what it can. ``TrialLaunched.isolation`` says what each
    trial got."""
    read_only: list[str] = []
    """For ``kind: local`` and ``kind: slurm``: absolute paths a sandboxed job may read besides its worktree and
    the Python environment (data sets, caches). A path holding the launcher's data directory is refused."""
    partition: SlurmToken | None = None
    """For ``kind: slurm`` (sbatch ``--partition``)."""
    account: SlurmToken | None = None
    """For ``kind: slurm`` (``--account``)."""
    qos: SlurmToken | None = None
    """For ``kind: slurm`` (``--qos``)."""
    time_limit: SlurmTime | None = None
    """Slurm's own limit (``--time``): ``minutes``, ``hh:mm:ss`` or ``d-hh:mm:ss``; reaching it ends the trial
    ``timeout``."""
    gres: SlurmToken | None = None
    """Per node, e.g. ``gpu:8`` (``--gres``); its GPU count prices the trial's accelerator-seconds."""
    constraint: SlurmToken | None = None
    """For ``kind: slurm``: node features (``--constraint``)."""
    exclusive: bool = False
    """For ``kind: slurm``: whole nodes (``--exclusive``)."""
    extra_sbatch: list[str] = []
    """More sbatch options, one ``--option=value`` per item (never through a shell)."""
    namespace: KubernetesName = "default"
    """For ``kind: kubernetes``: the namespace the trials' objects are created in."""
    image: str | None = None
    """For ``kind: kubernetes`` (required there): the container image every rank runs; it holds the workload's
    Python environment with InfraRSI installed."""
    manifest: Literal["pytorchjob", "job"] = "pytorchjob"
    """For ``kind: kubernetes``: ``pytorchjob`` — a Kubeflow ``PyTorchJob`` (needs the training operator);
    ``job`` — an indexed ``batch/v1 Job`` and a headless ``Service`` (any cluster)."""
    gpus_per_node: int = Field(default=0, ge=0)
    """For ``kind: kubernetes``: ``nvidia.com/gpu`` per pod (one pod per node); prices accelerator-seconds."""
    volume_claim: KubernetesName | None = None
    """For ``kind: kubernetes``: a ReadWriteMany PersistentVolumeClaim holding the launcher's data directory;
    every pod mounts it at the same path, so worktrees, launch files and probe files are shared."""
    service_account: KubernetesName | None = None
    """For ``kind: kubernetes``: the pods' service account."""
    kubeconfig: str | None = None
    """For ``kind: kubernetes``: the kubeconfig file the launcher uses (default: in-cluster, else
    ``~/.kube/config``)."""
    image_python: str = "python3"
    """For ``kind: kubernetes``: the interpreter inside ``image`` (replaces the launcher's own in a rank's argv)."""

    @field_validator("read_only")
    @classmethod
    def _absolute_inputs(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item.startswith("/") or "\x00" in item:
                raise ValueError(f"read_only: {item!r} is not an absolute path")
        return value

    @field_validator("extra_sbatch")
    @classmethod
    def _sbatch_options(cls, value: list[str]) -> list[str]:
        for item in value:
            name, _, arg = item.partition("=")
            if not re.fullmatch(r"--[a-z][a-z0-9-]*", name) or (arg and not _SLURM_TOKEN.fullmatch(arg)):
                raise ValueError(f"{item!r} is not one sbatch option (--name or --name=single-token)")
            if name in _SBATCH_OWNED:
                raise ValueError(f"{name} is set by the Slurm backend itself")
        return value

    @model_validator(mode="after")
    def _options_fit_kind(self) -> BackendSpec:
        # a field counts as given when it differs from its default (a dumped contract restates every field)
        given = {
            k for k, f in type(self).model_fields.items()
            if k not in ("kind", "parallel", "timeout_s") and getattr(self, k) != f.get_default(call_default_factory=True)
        }  # fmt: skip
        allowed = {
            "local": {"netns", "isolation", "read_only"},
            "sim": {"scenario"},
            "slurm": {*SLURM_FIELDS, "isolation", "read_only"},
            "kubernetes": set(KUBERNETES_FIELDS),
        }[self.kind]
        if extra := sorted(given - allowed):
            raise ValueError(f"{', '.join(extra)} do not apply to backend kind {self.kind}")
        if self.kind == "kubernetes" and not self.image:
            raise ValueError("backend kind kubernetes needs an image (the container every rank runs)")
        return self


class ScopeSpec(StrictModel):
    """What a candidate may change. Everything else is locked (hashed at init, checked on every trial)."""

    files: list[str] = []
    """Globs relative to the repo (``*`` within a directory, ``**`` across, a trailing ``/`` = everything
    under): the only files patches may touch."""
    launch_keys: list[str] = []
    """Keys of the launch file that candidates may set; dotted for nested sections
    (``knobs.micro_batch_size`` sets ``micro_batch_size`` under ``knobs:``)."""

    @field_validator("launch_keys")
    @classmethod
    def _unique_keys(cls, value: list[str]) -> list[str]:
        dupes = sorted({k for k in value if value.count(k) > 1})
        if dupes:
            raise ValueError(f"duplicate launch keys {dupes}")
        return value


class SearchSpace(StrictModel):
    """What the search may try."""

    knobs: dict[str, Knob] = {}
    """Launch key → its type and allowed values; every key must be in ``scope.launch_keys``."""
    constraints: Constraints = Constraints()
    """Relations between knobs."""
    patches: list[str] = []
    """Ids of patches from the workload's patch library the search may apply."""


class LossTrend(StrictModel):
    """Divergence over the verify horizon (invariant ``loss.trend``): a gap to the baseline that grows step after
    step fails even when every point is inside the tolerance.

    Rule: the gap at each compared step of the train loss (and of the eval loss, when it has ``min_points``
    evals), in units of that step's tolerance, is fitted by least squares against the step; the candidate
    fails when the line extrapolated to ``horizon_multiple`` × the verify horizon is beyond the tolerance
    *and* a one-sided t-test on the slope (growing away from zero) is significant at ``alpha``.
    """

    horizon_multiple: float = Field(default=2.0, ge=1)
    """Where the fitted gap must still be inside the tolerance, as a multiple of the verify horizon
    (``workload.verify_steps``); 1 means only at the horizon itself."""
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    """One-sided significance level of the slope test: how sure the gap is growing before it can fail."""
    min_points: int = Field(default=6, ge=3)
    """Fewer compared steps than this leave ``loss.trend`` unchecked (named in the verdict, never passed)."""


class LossInvariant(StrictModel):
    """The candidate's loss curve must stay within tolerance of the baseline's."""

    tolerance: float = Field(gt=0)
    """Allowed deviation: a fraction of the baseline loss (``relative``) or loss units (``absolute``)."""
    mode: Literal["relative", "absolute"] = "relative"
    """How ``tolerance`` is measured."""
    at: Literal["every_eval", "every_step"] | list[Annotated[int, Field(ge=1)]] = "every_eval"
    """Where the curves are compared: every eval, every step, or the listed steps."""
    trend: LossTrend | None = LossTrend()
    """Checked at verify: the gap's trend over the horizon (``loss.trend``); ``null`` turns it off."""


class TightParity(StrictModel):
    """``invariants.parity: tight``: per-step agreement far inside the loss invariant's ε (``loss.parity``).

    Every step of the baseline's train loss (and every eval) must be in the candidate's curve with
    ``|candidate − baseline| ≤ max_abs + max_rel · |baseline|`` (``numpy.isclose``'s rule), across the whole
    verify horizon."""

    max_abs: float = Field(default=1e-6, ge=0)
    """Absolute part of the allowed per-step deviation, in loss units."""
    max_rel: float = Field(default=1e-4, ge=0)
    """Relative part of the allowed per-step deviation, a fraction of the baseline's loss at that step."""


class Invariants(StrictModel):
    """What makes a candidate the same training run (ARCHITECTURE.md §7)."""

    loss: LossInvariant
    """Loss-curve agreement."""
    steps: bool = True
    """Same number of optimiser steps (counted by the probe)."""
    tokens: bool = True
    """Same tokens per optimiser step."""
    eval: bool = True
    """Same eval batch and eval interval."""
    timing_tolerance: float = Field(default=0.10, gt=0, le=1)
    """Largest allowed |launcher wall over steady steps − sum of reported step times| / wall."""
    parity: Literal["none", "tight", "bitwise"] = "none"
    """Numeric parity at verify, beyond ``loss``: ``none``; ``tight`` (``loss.parity`` with ``parity_tight``'s
    tolerances at every step); ``bitwise`` (verify runs with torch's deterministic algorithms on, told through
    ``INFRARSI_DETERMINISTIC``; the candidate's loss trajectory must equal the baseline's exactly, and a run
    that turned determinism off or could not report it is refused as ``parity.deterministic``)."""
    parity_tight: TightParity = TightParity()
    """The tolerances of ``parity: tight``."""


class Budget(StrictModel):
    """What the search may spend."""

    trials: int = Field(ge=1)
    """Search trials (baseline, doctor and verify runs not counted)."""
    accelerator_hours: float = Field(gt=0)
    """Accelerator-hours for the whole study, failed trials included."""
    repeats_per_trial: int = Field(default=1, ge=1)
    """Runs of each search candidate (doctor may recommend more)."""
    llm_tokens: int = Field(default=0, ge=0)
    """Language-model tokens (prompt + completion) the agent may spend on this study; 0 = no agent."""
    llm_usd: float | None = Field(default=None, ge=0)
    """Cost cap in US dollars for the agent, at ``agent.usd_per_1k_tokens``; ``None`` = tokens only."""
    stop_slow_factor: float | None = Field(default=2.0, gt=1)
    """A search trial whose steady steps are already this many times the incumbent's step time (and beyond
    the doctor's noise floor) is stopped early as ``stopped_slow``, its steps kept as a measurement;
    ``None``: never stop one (docs/trials.md). Baselines, doctor runs and verify repeats are never stopped."""


class DoctorSpec(StrictModel):
    """The baseline health check."""

    repeats: int = Field(default=5, ge=2)
    """Baseline runs; at least 2 to measure run-to-run noise."""


DOWNSTREAM_PLACEHOLDERS = frozenset({"python", "launch_file", "weights"})
"""The only ``{...}`` names allowed in ``verify.downstream.command``; the launcher fills them per run."""


class CheckpointRestartSpec(StrictModel):
    """Checkpoint restart at verify (invariants ``checkpoint.restart``, ``checkpoint.across_change``).

    Every verify run is told to save a checkpoint after ``at_step`` optimiser steps (``INFRARSI_CHECKPOINT_DIR``,
    ``INFRARSI_CHECKPOINT_STEP``) and goes on uninterrupted. After the first pair of a round, a fresh process of
    the candidate resumes from the candidate run's checkpoint (``INFRARSI_RESUME_FROM``) and runs to the verify
    horizon; its loss at every step must stay within the loss invariant's ε of the uninterrupted run's."""

    at_step: int | None = Field(default=None, ge=1)
    """Optimiser steps done when the checkpoint is saved; ``None``: half the verify horizon. Must be below
    ``workload.verify_steps``."""
    across_change: bool = False
    """Also resume the *baseline* run's checkpoint under the candidate's code and knobs
    (``checkpoint.across_change``): for jobs whose checkpoints must survive the change (a production job
    switched in flight). Off by default: a change may legitimately alter the checkpoint's format (``fused-qkv``
    renames three weights into one)."""

    def step_for(self, verify_steps: int) -> int:
        return self.at_step if self.at_step is not None else max(1, verify_steps // 2)


class DownstreamSpec(StrictModel):
    """A downstream evaluation at verify (invariant ``downstream``): a command run on the final weights of every
    verify run (baseline and candidate), whose metric the candidate must not worsen beyond a tolerance.

    The job is told where to save its final weights (``INFRARSI_FINAL_WEIGHTS_DIR``); after it exits ok the
    launcher runs ``command`` in the run's worktree (no shell) and reads the metric from the last line of its
    standard output that is a JSON object."""

    command: list[str] = Field(min_length=1)
    """argv; placeholders ``{python}``, ``{launch_file}`` (the run's launch file), ``{weights}`` (the final
    weights directory). Runs with the workload's environment."""
    metric: str = Field(min_length=1)
    """Key of the metric in the JSON object the command prints, e.g. ``perplexity``."""
    higher_is_better: bool = False
    """``False``: lower is better (perplexity, loss); ``True``: higher is better (accuracy)."""
    tolerance: float = Field(default=0.01, ge=0)
    """How much worse than the paired baseline's the candidate's metric may be."""
    mode: Literal["relative", "absolute"] = "relative"
    """``relative``: a fraction of the baseline's metric; ``absolute``: in the metric's units."""
    timeout_s: float = Field(default=600.0, gt=0)
    """The command is killed after this long and the run's downstream result names the timeout."""

    @field_validator("command")
    @classmethod
    def _known_placeholders(cls, command: list[str]) -> list[str]:
        for arg in command:
            try:
                fields = list(string.Formatter().parse(arg))
            except ValueError as exc:
                raise ValueError(f"bad braces in {arg!r}: {exc}") from None
            for _literal, name, _spec, _conversion in fields:
                if name is not None and name not in DOWNSTREAM_PLACEHOLDERS:
                    allowed = ", ".join(sorted(DOWNSTREAM_PLACEHOLDERS))
                    raise ValueError(f"unknown placeholder {{{name}}} in {arg!r} (allowed: {allowed})")
        return command

    def allowed(self, baseline_metric: float) -> float:
        return self.tolerance * abs(baseline_metric) if self.mode == "relative" else self.tolerance

    def worse_by(self, baseline_metric: float, candidate_metric: float) -> float:
        """How much worse the candidate is (negative: better)."""
        diff = candidate_metric - baseline_metric
        return -diff if self.higher_is_better else diff


class VerifySpec(StrictModel):
    """Re-running the best candidates against the baseline."""

    top_k: int = Field(default=2, ge=1)
    """Candidates verified."""
    repeats: int = Field(default=3, ge=1)
    """Interleaved baseline/candidate pairs per verification round (A B A B …)."""
    passes_required: int = Field(default=2, ge=1)
    """Verification rounds a candidate must pass (every invariant on every run, CI lower bound > 1) to be
    promotable; a failed round ends its verification."""
    checkpoint_restart: CheckpointRestartSpec | None = None
    """Resume from a mid-run checkpoint in a fresh process and compare (docs/stages.md); ``None``: not checked."""
    downstream: DownstreamSpec | None = None
    """Evaluate the final weights of both arms with a user command and compare (docs/stages.md); ``None``: not
    checked."""


class AgentSpec(StrictModel):
    """The study's language model (docs/agent.md). Used only when ``budget.llm_tokens`` > 0 and an endpoint
    is configured here or by ``INFRARSI_LLM_BASE_URL``/``INFRARSI_LLM_MODEL``. The API key is never written
    here: it comes from ``INFRARSI_LLM_API_KEY`` or the file ``key_file`` names."""

    base_url: str | None = None
    """OpenAI-compatible server, e.g. ``http://localhost:8000/v1``; ``None`` = ``$INFRARSI_LLM_BASE_URL``."""
    model: str | None = None
    """Model name the server serves; ``None`` = ``$INFRARSI_LLM_MODEL``."""
    key_file: str | None = None
    """File holding the API key (first line); ``None`` = ``$INFRARSI_LLM_API_KEY`` or
    ``$INFRARSI_LLM_API_KEY_FILE``, or no key."""
    share: float = Field(default=0.25, ge=0, le=1)
    """At most this share of the study's search trials may be the agent's proposals (origin ``llm``)."""
    ask_every: int = Field(default=4, ge=1)
    """The model is asked when the search starts and again after this many finished trials."""
    max_asks: int = Field(default=4, ge=0)
    """Exchanges per study, at most."""
    prior_weight: float = Field(default=0.5, gt=0, le=1)
    """How much a model's prior counts: its stated std is divided by sqrt(weight) (0.5 → √2 wider)."""
    max_patches: int = Field(default=3, ge=0)
    """Diffs kept from one answer, at most."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Per HTTP request."""
    retries: int = Field(default=2, ge=0)
    """Retries after a timeout, a connection error, HTTP 429 or 5xx (exponential backoff from 1 s)."""
    max_tokens: int = Field(default=2048, ge=16)
    """Completion tokens asked for per answer."""
    usd_per_1k_tokens: float = Field(default=0.0, ge=0)
    """Price used for ``budget.llm_usd`` and the cost shown in the report."""


def _policy_json_schema(schema: dict[str, Any]) -> None:
    # The field holds a Policy once loaded, but in YAML it may also be a path to a policy file.
    schema["anyOf"] = [*schema.get("anyOf", []), {"type": "string", "description": "path to a policy YAML"}]


class Contract(StrictModel):
    """A study contract, as written in ``contract.yaml``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Short name of the study (letters, digits, ``.``, ``_``, ``-``)."""
    goal: str
    """What the user wants, in a sentence; shown in reports."""
    workload: WorkloadSpec
    """The training job."""
    cluster: ClusterSpec
    """Where trials run."""
    backend: BackendSpec = BackendSpec()
    """How trials are launched."""
    scope: ScopeSpec
    """Editable files and launch keys."""
    search_space: SearchSpace = SearchSpace()
    """Knobs, constraints and patches the search may use."""
    invariants: Invariants
    """What must not change."""
    budget: Budget
    """What the study may spend."""
    doctor: DoctorSpec = DoctorSpec()
    """Baseline health check."""
    verify: VerifySpec = VerifySpec()
    """Verification of the best candidates."""
    agent: AgentSpec = AgentSpec()
    """The language model that may propose candidates, diffs and priors (only with ``budget.llm_tokens``)."""
    policy: Policy | None = Field(default=None, json_schema_extra=_policy_json_schema)
    """Apply policy, inline or as a path relative to the contract file; when absent every change needs one
    approval by role ``owner``."""

    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _checkpoint_inside_the_verify_horizon(self) -> Contract:
        restart, horizon = self.verify.checkpoint_restart, self.workload.verify_steps
        if restart is not None and restart.step_for(horizon) >= horizon:
            raise ValueError(
                f"verify.checkpoint_restart.at_step {restart.at_step} leaves nothing to resume: it must be below "
                f"workload.verify_steps {horizon}"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _flags_without_dashes(cls, data: Any) -> Any:
        """With ``knobs_via: argv`` a key may be written as the flag (``--max_steps``); it is stored as the
        flag's name (``max_steps``), so every field that names it agrees."""
        if not isinstance(data, Mapping):
            return data
        workload = data.get("workload")
        if not isinstance(workload, Mapping) or workload.get("knobs_via") != "argv":
            return data
        data = copy.deepcopy(dict(data))
        strip = _strip_flag_dashes
        workload = data["workload"] = dict(workload)
        if isinstance(workload.get("steps_key"), str):
            workload["steps_key"] = strip(workload["steps_key"])
        scope = data.get("scope")
        if isinstance(scope, Mapping) and isinstance(scope.get("launch_keys"), list):
            data["scope"] = {**scope, "launch_keys": [strip(k) for k in scope["launch_keys"]]}
        space = data.get("search_space")
        if isinstance(space, Mapping):
            space = data["search_space"] = dict(space)
            if isinstance(space.get("knobs"), Mapping):
                space["knobs"] = {strip(k): v for k, v in space["knobs"].items()}
            gb = (space.get("constraints") or {}).get("global_batch") if isinstance(space.get("constraints"), Mapping) else None
            if isinstance(gb, Mapping):
                gb = {k: strip(v) if k.endswith("_key") and isinstance(v, str) else v for k, v in gb.items()}
                if isinstance(gb.get("parallel_keys"), list):
                    gb["parallel_keys"] = [strip(k) if isinstance(k, str) else k for k in gb["parallel_keys"]]
                space["constraints"] = {**space["constraints"], "global_batch": gb}
        return data

    @field_validator("policy", mode="before")
    @classmethod
    def _load_policy_file(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        base = Path((info.context or {}).get("base_dir") or ".")
        path = base / value
        try:
            data = userfiles.load_yaml(path, what="the policy file")
        except FileNotFoundError:
            raise ValueError(f"policy file {path} not found") from None
        if not isinstance(data, dict):
            raise ValueError(f"policy file {path} must hold a mapping")
        return data

    # ---------------------------------------------------------------- questions the rest of the code asks

    @property
    def source(self) -> Path | None:
        """The contract file this was loaded from, if any."""
        return self._source

    @property
    def apply_policy(self) -> Policy:
        """The policy, or the default (one approval by ``owner`` for every class) when none is given."""
        return self.policy or Policy()

    @cached_property
    def _scope_patterns(self) -> list[re.Pattern[str]]:
        return [re.compile(glob_to_regex(g)) for g in self.scope.files]

    def editable(self, path: str | os.PathLike[str]) -> bool:
        """Whether a repo-relative path is inside the editable scope (pure: does not look at the disk)."""
        rel = normalise_rel(path)
        if rel is None:
            return False
        return any(p.fullmatch(rel) for p in self._scope_patterns)

    def knob_value_ok(self, key: str, value: Any) -> str | None:
        """``None`` if ``value`` is legal for knob ``key``, else the reason (unknown key, type, range, or a
        value that could become an extra argument of the job)."""
        knob = self.search_space.knobs.get(key)
        if knob is None:
            return f"{key!r} is not a knob of the search space"
        return launch.value_problem(key, value, self.workload.knobs_via) or knob.problem(value)

    def with_study_patches(self, patch_ids: Iterable[str]) -> Contract:
        """This contract with patches that became the study's after ``init`` (the agent's checked diffs,
        ``events.AgentPatch``) added to ``search_space.patches``; the scope, invariants and budget unchanged."""
        new = [p for p in patch_ids if p not in self.search_space.patches]
        if not new:
            return self
        search = self.search_space.model_copy(update={"patches": [*self.search_space.patches, *new]})
        return self.model_copy(update={"search_space": search})

    def candidate_problems(self, knobs: Mapping[str, Any], patches: Sequence[str] = ()) -> list[str]:
        """Every reason a knob vector + patch set is outside the contract (empty = inside)."""
        problems = [f"{k}: {r}" for k, v in knobs.items() if (r := self.knob_value_ok(k, v))]
        gb = self.search_space.constraints.global_batch
        involved = {gb.micro_batch_key, *gb.parallel_keys} if gb is not None else set()
        if gb is not None and involved & set(knobs) and not problems:
            values = dict(knobs)
            if involved - set(knobs):  # the keys the candidate leaves at their golden values
                with contextlib.suppress(OSError, ValueError):
                    golden = self.baseline_launch()
                    for key in involved - set(knobs):
                        found, value = get_dotted(golden, key)
                        if found:
                            values[key] = value
            if gb.micro_batch_key in values and (reason := gb.problem(values)):
                problems.append(reason)
        problems += [
            f"patch {p!r} is not in search_space.patches"
            for p in patches
            if p not in self.search_space.patches
        ]
        return problems

    def action_classes(
        self, changed_keys: Iterable[str], patch_ids: Iterable[str], library: Mapping[str, PatchInfo]
    ) -> list[str]:
        """The apply-policy classes of a change: each changed launch key's knob class, each patch's class.

        A key that is not a knob counts as ``launch_keys``; a patch missing from ``library`` as ``code_patch``.
        """
        classes: set[str] = set()
        for key in changed_keys:
            knob = self.search_space.knobs.get(key)
            classes.add(knob.action_class if knob is not None else "launch_keys")
        for patch_id in patch_ids:
            info = library.get(patch_id)
            classes.add(info.action_class if info is not None else "code_patch")
        return sorted(classes)

    def baseline_launch(self) -> dict[str, Any]:
        """The golden launch values: the launch file as a dict (read from the workload repo), or for the
        other deliveries the flat ``key → value`` of ``golden_values``."""
        if self.workload.launch_file is None:
            return self.golden_values()
        return read_launch(self.workload.repo / self.workload.launch_file)

    def golden_values(self) -> dict[str, Any]:
        """Every value the golden launch gives, by key, typed by the knob of that key where there is one.

        ``launch_file``: the launch file's mapping (nested; read keys with ``get_dotted``). ``argv``: each
        flag of the golden command (a switch is ``True``, its negation ``False``); ``env``: ``workload.env``;
        ``overrides``: each ``key=value`` item of the command. A written value the knob cannot read is kept
        as text, so ``check_contract`` names it."""
        workload = self.workload
        raw: Mapping[str, str | bool]
        match workload.knobs_via:
            case "launch_file":
                return self.baseline_launch()
            case "argv":
                raw = launch.argv_golden(workload.command)
            case "env":
                raw = workload.env
            case "overrides":
                raw = launch.overrides_golden(workload.command)
        return {key: self._typed(key, text) for key, text in raw.items()}

    def _typed(self, key: str, text: str | bool) -> Any:
        if isinstance(text, bool):
            return text
        match self.search_space.knobs.get(key):
            case BoolKnob():
                parsed = launch.parse_bool(text)
                return text if parsed is None else parsed
            case IntKnob():
                with contextlib.suppress(ValueError):
                    return int(text)
                return text
            case FloatKnob():
                with contextlib.suppress(ValueError):
                    return float(text)
                return text
            case ChoiceKnob(choices=choices):
                return next((c for c in choices if text in (str(c), launch.written(c, text))), text)
        return launch.scalar(text)

    def launch_values(self, knobs: Mapping[str, Any], steps: int | None = None) -> dict[str, Any]:
        """Every key a trial sets, in order: the knobs, the derived accumulation, the ``steps`` horizon."""
        values = dict(knobs)
        gb = self.search_space.constraints.global_batch
        if gb is not None and gb.accumulation_key is not None:
            micro_batch = values.get(gb.micro_batch_key)
            if micro_batch is None:
                found, micro_batch = get_dotted(self.baseline_launch(), gb.micro_batch_key)
                micro_batch = micro_batch if found else None
            if isinstance(micro_batch, int) and not isinstance(micro_batch, bool) and micro_batch > 0:
                parallel = {key: values[key] if key in values else get_dotted(self.baseline_launch(), key)[1]
                            for key in gb.parallel_keys}
                values[gb.accumulation_key] = gb.accumulation(micro_batch, gb.data_parallel_for(parallel))
        horizon = steps if steps is not None else self.workload.steps
        values[self.workload.steps_key] = horizon * (self.workload.steps_key_tokens or 1)
        return values

    def launch_for(self, knobs: Mapping[str, Any], steps: int | None = None) -> dict[str, Any]:
        """The launch dict of a trial: golden file ← knobs ← derived accumulation ← ``steps`` horizon."""
        launch_dict = self.baseline_launch()
        for key, value in self.launch_values(knobs, steps).items():
            set_dotted(launch_dict, key, value)
        return launch_dict

    def command_for(self, *, python: str, launch_file: str | None = None, probe_dir: str) -> list[str]:
        """The job's golden argv with placeholders filled in (each element formatted alone; no shell)."""
        values = {"python": python, "launch_file": launch_file or "", "probe_dir": probe_dir}
        return [arg.format_map(values) for arg in self.workload.command]

    def trial_launch(
        self, knobs: Mapping[str, Any], steps: int | None, *, python: str, launch_file: str | None, probe_dir: str
    ) -> TrialLaunch:
        """What the launcher starts for a trial: argv, the workload's environment and (for ``launch_file``
        delivery) the launch mapping to write at ``launch_file``, with the knob values delivered
        ``workload.knobs_via``. Raises ``LaunchValueError`` naming the knob whose value could become an
        extra argument (a string starting with ``-``, a newline or NUL)."""
        workload = self.workload
        values = self.launch_values(knobs, steps)
        problems = [p for key, value in values.items() if (p := launch.value_problem(key, value, workload.knobs_via))]
        if problems:
            raise LaunchValueError("; ".join(problems))
        argv = self.command_for(python=python, launch_file=launch_file, probe_dir=probe_dir)
        match workload.knobs_via:
            case "launch_file":
                return TrialLaunch(argv, dict(workload.env), self.launch_for(knobs, steps))
            case "argv":
                argv = launch.argv_with(argv, values, switch_off=workload.argv_switch_off)
                return TrialLaunch(argv, dict(workload.env), None)
            case "env":
                return TrialLaunch(argv, launch.env_with(workload.env, values), None)
            case "overrides":
                return TrialLaunch(launch.overrides_with(argv, values), dict(workload.env), None)

    def locked_inputs(self) -> dict[str, str]:
        """The fingerprints of ``workload.inputs`` (``infrarsi.study.inputs.fingerprint``), for ``StudyCreated``."""
        workload = self.workload
        return inputs.fingerprint(workload.repo, workload.inputs, hash_limit_bytes=workload.inputs_hash_limit_bytes)

    def locked_files(self, repo: Path | str | None = None) -> dict[str, str]:
        """sha256 of every non-editable tracked file of ``repo`` (default: the workload repo), by path.

        Tracked = ``git ls-files`` when ``repo`` is the top of a git repository, else every file under it;
        ``.git`` and ``__pycache__`` are ignored. A symlink is hashed by its target, not followed.
        """
        root = Path(repo) if repo is not None else self.workload.repo
        return {rel: file_sha256(root / rel) for rel in tracked_files(root) if not self.editable(rel)}

    def patch_library(self) -> dict[str, PatchInfo]:
        """The workload's patch library, by id."""
        return load_patch_library(self.workload.repo / self.workload.patch_dir)

    def to_dict(self) -> dict[str, Any]:
        """Normalised JSON (policy inlined, paths absolute, defaults filled) for ``StudyCreated.contract``."""
        return self.model_dump(mode="json", by_alias=True)

    def sha256(self) -> str:
        """Hash of the normalised contract (key order independent)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()
