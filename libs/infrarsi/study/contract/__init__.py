"""The study contract: what InfraRSI may change in a workload, what must stay the same, and the budget.

The package, by concern (import from the package; the modules are its floor plan):

- ``models``: the pydantic models, one per concern, and ``Contract``, which answers the questions every other
  part asks (is this file editable, is this knob value legal, what does a trial launch, which files are locked);
- ``knobs``: the knob types and the constraints between knobs;
- ``patches``: the patch-library format and loader (``load_patch_library``);
- ``repository``: paths, globs, tracked files and hashes of the workload on disk, and launch files' dotted keys;
- ``checks``: ``check_contract``, the contract against the workload and itself;
- ``loading``: ``load_contract``, ``contract_from_dict``, ``locked_contract`` and the JSON Schema;
- ``base``: the strict base model, ``Problem`` and ``ContractError``.

Validation happens here, at the edge: inner code receives a ``Contract``, never a dict.

Validation runs in two passes. Pydantic checks the shape (types, unknown fields, ranges, choices);
``check_contract`` then checks the contract against the workload on disk and against itself (scope inside
the repo, knobs inside the editable launch keys, the global-batch constraint satisfiable, patches present).
Both report ``ContractError`` with the field path of every problem.

A study's contract travels locked in ``StudyCreated.contract`` (``Contract.to_dict``: defaults filled, paths
absolute); ``locked_contract(created)`` turns it back into a ``Contract``, once per contract. Services and
commands read it through that, never by walking the dict: the defaults live only in the models here.

This package reads files and lists a workload's tracked files with ``git ls-files``; it never writes, changes
a repository, or talks to the bus.
"""

from infrarsi.study.contract.base import ContractError, Problem, StrictModel, pydantic_problems
from infrarsi.study.contract.checks import check_contract
from infrarsi.study.contract.knobs import (
    BoolKnob,
    ChoiceKnob,
    Constraints,
    FloatKnob,
    GlobalBatchConstraint,
    IntKnob,
    Knob,
    KnobActionClass,
)
from infrarsi.study.contract.loading import (
    contract_from_dict,
    contract_json_schema,
    load_contract,
    locked_contract,
)
from infrarsi.study.contract.models import (
    COMMAND_PLACEHOLDERS,
    DOWNSTREAM_PLACEHOLDERS,
    INVARIANT_NAMES,
    KUBERNETES_FIELDS,
    SLURM_FIELDS,
    AgentSpec,
    BackendSpec,
    Budget,
    CheckpointRestartSpec,
    ClusterSpec,
    Contract,
    DoctorSpec,
    DownstreamSpec,
    Invariants,
    KubernetesName,
    LauncherSpec,
    LossInvariant,
    LossTrend,
    MeasurementSpec,
    NetnsName,
    ScopeSpec,
    SearchSpace,
    ShapeSpec,
    SlurmTime,
    SlurmToken,
    TightParity,
    TrialLaunch,
    VerifySpec,
    WorkloadSpec,
)
from infrarsi.study.contract.patches import (
    PATCH_SUFFIXES,
    LogRatioPrior,
    PatchIndex,
    PatchInfo,
    load_patch_library,
)
from infrarsi.study.contract.repository import (
    IGNORED_DIRS,
    file_sha256,
    get_dotted,
    glob_matches,
    glob_to_regex,
    inside_problem,
    normalise_rel,
    read_launch,
    set_dotted,
    tracked_files,
)

__all__ = ["AgentSpec", "BackendSpec", "BoolKnob", "Budget", "COMMAND_PLACEHOLDERS", "CheckpointRestartSpec", "ChoiceKnob", "ClusterSpec", "Constraints", "Contract", "ContractError", "DOWNSTREAM_PLACEHOLDERS", "DoctorSpec", "DownstreamSpec", "FloatKnob", "GlobalBatchConstraint", "IGNORED_DIRS", "INVARIANT_NAMES", "IntKnob", "Invariants", "KUBERNETES_FIELDS", "Knob", "KnobActionClass", "KubernetesName", "LauncherSpec", "LogRatioPrior", "LossInvariant", "LossTrend", "MeasurementSpec", "NetnsName", "PATCH_SUFFIXES", "PatchIndex", "PatchInfo", "Problem", "SLURM_FIELDS", "ScopeSpec", "SearchSpace", "ShapeSpec", "SlurmTime", "SlurmToken", "StrictModel", "TightParity", "TrialLaunch", "VerifySpec", "WorkloadSpec", "check_contract", "contract_from_dict", "contract_json_schema", "file_sha256", "get_dotted", "glob_matches", "glob_to_regex", "inside_problem", "load_contract", "load_patch_library", "locked_contract", "normalise_rel", "pydantic_problems", "read_launch", "set_dotted", "tracked_files"]
