"""A prepared check for a CUDA machine: the reference workloads on a GPU, with the probe.

    python bench/gpu_check.py [--json OUT.json] [--peak-flops 989e12]

1. dense and MoE GPT train on CUDA (NCCL process group of one rank), bf16 autocast + SDPA, and the probe
   reports CUDA allocator peak memory and MFU (peak FLOP/s from --peak-flops, else a per-SKU table);
2. a real CUDA OOM: a large model at a huge micro-batch must raise ``torch.OutOfMemoryError`` — caught in
   process here, and, run as the job, exit non-zero with the traceback unchanged in its output.
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

    results["failures"] = failures
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    for failure in failures:
        print(f"FAIL {failure}")
    print("gpu_check:", "ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
