"""What the doctor knows about the host is a prior: a CPU without bf16 units starts the search from that fact."""

from __future__ import annotations

from pathlib import Path

import yaml
from infrarsi import events as ev
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.priors import default_knowledge_base
from infrarsi.study.contract import load_contract
from infrarsi.study.model import build_searcher
from infrarsi.study.space import StudySpace
from infrarsi.verdicts.doctor import native_matmul_dtypes

WORKLOAD = Path(__file__).resolve().parents[2] / "workloads" / "gpt"
AVX2_HOST = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
AMX_HOST = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_native_dtypes_follow_the_flags_and_onednn_isa_cap() -> None:
    assert native_matmul_dtypes(AVX2_HOST, env={})[0] == ("float32",)
    assert native_matmul_dtypes(AMX_HOST, env={})[0] == ("float32", "bfloat16")
    dtypes, why = native_matmul_dtypes(AMX_HOST, env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert dtypes == ("float32",) and "ONEDNN_MAX_CPU_ISA=AVX2" in why["bfloat16"]
    assert native_matmul_dtypes(AMX_HOST, env={"ONEDNN_MAX_CPU_ISA": "avx512_core_amx"})[0] == ("float32", "bfloat16")


def test_the_host_replaces_every_spelling_of_the_bf16_prior_on_a_cpu_only() -> None:
    cpu = default_knowledge_base("cpu").with_overrides(time={"autocast_dtype=bfloat16": (-0.5, 0.1)})
    slow = cpu.with_host(["float32"])
    assert slow.time["bf16"][0] > 1.0 and "autocast_dtype=bfloat16" not in slow.time
    assert cpu.with_host(["float32", "bfloat16"]).time["bf16"][0] < 0
    assert cpu.with_host([]) is cpu  # nothing measured: the generic belief stands
    gpu = default_knowledge_base("gpu")
    assert gpu.with_host(["float32"]) is gpu  # a GPU's table already assumes bf16 tensor cores


def _doctor(native: list[str]) -> ev.DoctorCompleted:
    return ev.DoctorCompleted(repeats=3, baseline_trial_ids=[], step_time_s=0.5, run_to_run_cv=0.05,
                              step_to_step_cv=0.05, warmup_steps=1, phase_fractions={}, per_rank_step_s=[],
                              stragglers=[], min_detectable_speedup=1.2, repeats_per_trial=1,
                              host_native_dtypes=native)


def _first_proposals(native: list[str], n: int = 6) -> list[str]:
    """The autocast dtype of the first ``n`` proposals on the dense reference job, after the doctor's three
    baseline runs (which the proposer observes), every trial answering like the baseline."""
    contract = load_contract(WORKLOAD / "contracts" / "dense-1node.yaml")
    launch = yaml.safe_load((WORKLOAD / "launch" / "dense-1node.yaml").read_text())
    study = StudySpace.from_contract(contract, baseline_launch=launch)
    searcher = build_searcher(study, "study-host", doctor=_doctor(native))
    for t in (0.50, 0.55, 0.52):
        searcher.observe(Observation(study.baseline, "ok", t, 0.45 * 2**30))
    dtypes = []
    for _ in range(n):
        (s,) = searcher.suggest(1)
        dtypes.append(s.candidate["autocast_dtype"])
        searcher.observe(Observation(s.candidate, "ok", 0.5, 0.5 * 2**30))
    return dtypes


def test_no_bf16_among_the_first_proposals_on_a_host_the_doctor_found_without_bf16() -> None:
    assert "bfloat16" not in _first_proposals(["float32"])
    # the same study where the doctor did not know the host: the generic prior tries bf16 early (this test
    # would pass trivially if the search never proposed it)
    assert "bfloat16" in _first_proposals([])


def test_the_report_names_the_host_as_the_source_of_the_bf16_prior() -> None:
    contract = load_contract(WORKLOAD / "contracts" / "dense-1node.yaml")
    study = StudySpace.from_contract(contract).with_host(["float32"])
    searcher = build_searcher(study, "study-host")
    spec = next(s for s in searcher.time_model.encoder.specs if s.name == "autocast_dtype=bfloat16")
    assert study.prior_source(spec) == "host"
    assert StudySpace.from_contract(contract).prior_source(spec) == "knowledge_base"
