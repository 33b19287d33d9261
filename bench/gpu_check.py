"""A prepared check for a CUDA machine: the reference workloads on a GPU, with the probe.

    python bench/gpu_check.py [--json OUT.json] [--peak-flops 989e12]

1. dense and MoE GPT train on CUDA (NCCL process group of one rank), bf16 autocast + SDPA, and the probe
   reports CUDA allocator peak memory and MFU (peak FLOP/s from --peak-flops, else a per-SKU table);
2. a real CUDA OOM: a large model at a huge micro-batch must raise ``torch.OutOfMemoryError`` — caught in
   process here, and, run as the job, exit non-zero with the traceback unchanged in its output;
3. the structural memory formula against measured CUDA peaks (``bench/formula_check.py``): a ~110M-parameter
   dense GPT at the golden layout and seven others (micro-batch ×4/×8, recomputation, bf16, and pairs); the
   formula is calibrated on the golden run's peak, as a study calibrates it on its baseline, and its prediction
   for each other layout is printed beside the measured peak (a ratio far from 1 on a layout the search needs
   is what the learned weight of the formula has to overrule).
Without CUDA it prints why and exits 0 (nothing to check on this host).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

WORKLOAD = Path(__file__).resolve().parent.parent / "workloads" / "gpt"

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
"""Dense bf16 tensor-core peak per device (no sparsity), by substring of the device name."""

BIG = {
    "model.d_model": 2048, "model.n_head": 16, "model.n_layer": 8, "model.mlp_hidden": 8192,
    "model.seq_len": 2048, "model.vocab_size": 512, "run.global_batch_size": 4096,
    "run.eval_batch_size": 16, "run.steps": 1,
}  # fmt: skip
"""A model and micro-batch far beyond any single GPU's memory with manual attention (B·H·T² scores)."""


def run_job(launch: str, overrides: dict[str, object], probe_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "train.py", "--launch-file", f"launch/{launch}.yaml", "--probe-dir", str(probe_dir)]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    return subprocess.run(args, cwd=WORKLOAD, env=env, capture_output=True, text=True, timeout=900)


FORMULA_MODEL = {
    "model.d_model": 1024, "model.n_head": 16, "model.n_layer": 8, "model.mlp_hidden": 4096, "model.seq_len": 1024,
    "run.eval_batch_size": 4, "run.steps": 3,
}  # fmt: skip
"""~110M parameters at 1024 tokens: activations of a few GB, so the peak is the model's, not the CUDA context's."""


def formula_vs_cuda(tmp: Path, env: dict[str, str], results: dict[str, object], failures: list[str], *,
                    device: str = "cuda", model: dict[str, object] = FORMULA_MODEL,
                    capacity_bytes: float | None = None, layouts: dict[str, dict[str, object]] | None = None) -> None:
    """Each ``formula_check.LAYOUTS`` layout of the ``model`` job measured on ``device``, then the formula's
    prediction for it, calibrated on the golden layout's peak with the shape the probe reported. (``device``,
    ``model``, ``capacity_bytes``, ``layouts``: the unit test runs the same path on a CPU with a tiny model; the
    formula is the GPU study's either way — a CPU study uses it only with a stated shape.)"""
    import yaml
    from formula_check import LAYOUTS, compare, device_contract, predict_peaks, table
    from infrarsi.probe import read_records
    from infrarsi.study.contract import load_contract

    measured: dict[str, float] = {}
    shape = None
    layouts = layouts or LAYOUTS
    for name, overrides in layouts.items():
        probe_dir = tmp / f"formula-{len(measured)}"
        proc = run_job("dense-1node", {**model, **overrides, "device": device}, probe_dir, env)
        if proc.returncode != 0:
            failures.append(f"formula layout {name!r} exited {proc.returncode}: {proc.stderr[-1500:]}")
            continue
        recs = read_records(probe_dir / "probe-rank0.jsonl")
        measured[name] = float(max(r.peak_memory_bytes for r in recs))
        shape = shape or next((r.shape for r in recs if r.shape is not None), None)
    if "golden" not in measured or shape is None:
        failures.append("formula check: the golden layout did not run, or the probe reported no shape")
        return
    capacity = capacity_bytes or torch.cuda.get_device_properties(0).total_memory
    contract = device_contract(load_contract(WORKLOAD / "contracts" / "dense-1node.yaml"), "cuda", capacity)
    launch = yaml.safe_load((WORKLOAD / "launch" / "dense-1node.yaml").read_text())
    rows = compare(measured, predict_peaks(contract, launch, shape, measured["golden"], layouts))
    print(table(rows))
    results["formula_vs_measured"] = [{"layout": r.layout, "measured_bytes": r.measured_bytes,
                                       "predicted_bytes": r.predicted_bytes, "ratio": r.ratio} for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--peak-flops", type=float, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this host; nothing to check (skipped).")
        return 0

    sys.path.insert(0, str(WORKLOAD))
    from infrarsi.probe import read_records

    name = torch.cuda.get_device_name(0)
    peak = args.peak_flops or next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    env = {**os.environ, "INFRARSI_PEAK_FLOPS": str(peak or "")}
    env.pop("INFRARSI_NATS_URL", None)
    results: dict[str, object] = {"device": name, "peak_flops": peak}
    failures = []
    fast = {
        "device": "cuda", "run.steps": 20, "knobs.autocast_dtype": "bfloat16", "knobs.attention": "sdpa",
        "knobs.micro_batch_size": 32, "knobs.optimizer_impl": "fused",
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for launch in ("dense-1node", "moe-1node"):
            for label, overrides in (("baseline", {"device": "cuda", "run.steps": 20}), ("fast", fast)):
                probe_dir = Path(tmp) / f"{launch}-{label}"
                proc = run_job(launch, overrides, probe_dir, env)
                if proc.returncode != 0:
                    failures.append(f"{launch}/{label} exited {proc.returncode}: {proc.stderr[-2000:]}")
                    continue
                recs = read_records(probe_dir / "probe-rank0.jsonl")
                steady = sorted(r.step_time_s for r in recs[3:])
                summary = {
                    "steps": len(recs),
                    "median_step_s": steady[len(steady) // 2],
                    "peak_memory_bytes": max(r.peak_memory_bytes for r in recs),
                    "mfu": recs[-1].mfu,
                    "flops_per_step": recs[-1].flops,
                    "final_loss": recs[-1].loss,
                    "tokens_per_step": recs[-1].tokens,
                    "optimizer_steps": recs[-1].optimizer_steps,
                }
                results[f"{launch}/{label}"] = summary
                print(f"{launch}/{label}: {json.dumps(summary)}")
                if not (summary["peak_memory_bytes"] > 0 and summary["optimizer_steps"] == 20):
                    failures.append(f"{launch}/{label}: bad probe counts {summary}")

        # Real OOM, in process: caught as torch.OutOfMemoryError.
        from config import load_launch
        from model import GPT

        cfg = load_launch(WORKLOAD / "launch" / "dense-1node.yaml", {k: v for k, v in BIG.items() if k.startswith("model.")})
        try:
            model = GPT(cfg.model).cuda()
            idx = torch.randint(0, 512, (512, cfg.model.seq_len), device="cuda")
            model(idx, idx).loss.backward()
            failures.append("in-process OOM: expected torch.OutOfMemoryError, the step fit")
        except torch.OutOfMemoryError as exc:
            results["oom_in_process"] = str(exc).splitlines()[0]
            print(f"in-process OOM caught: {results['oom_in_process']}")
        finally:
            model = idx = None
            torch.cuda.empty_cache()

        # Real OOM, as the job: non-zero exit, the traceback unchanged.
        proc = run_job("dense-1node", {**BIG, "device": "cuda", "knobs.micro_batch_size": 512}, Path(tmp) / "oom", env)
        results["oom_job_exit"] = proc.returncode
        if proc.returncode == 0 or "torch.OutOfMemoryError" not in proc.stderr:
            failures.append(f"job OOM: exit {proc.returncode}, traceback missing: {proc.stderr[-1500:]}")
        else:
            print(f"job OOM: exit {proc.returncode}, 'torch.OutOfMemoryError' in its output")

        # The formula against measured peaks, over a few layouts.
        formula_vs_cuda(Path(tmp), env, results, failures)

    results["failures"] = failures
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    for failure in failures:
        print(f"FAIL {failure}")
    print("gpu_check:", "ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
