"""``infrarsi scaffold [--out FILE] [--repo DIR] [--name NAME] [--force] -- <launch command>``.

Reads the command and the training script it starts (``infrarsi.study.scaffold``) and prints a commented contract
draft, or writes it to ``--out`` (never over an existing file without ``--force``; written whole or not at
all). What it found — framework, knobs, flags left out and unknown candidates — goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from infrarsi.commands import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="write the draft here (default: print it)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the directory the command runs in (default: .)")
    parser.add_argument("--name", default=None, help="the study name (default: the repo's directory name)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's launch command")


def run(args: argparse.Namespace) -> int:
    from infrarsi.study.scaffold import ScaffoldError, scaffold

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("give the launch command after '--', e.g. infrarsi scaffold -- torchrun --nproc-per-node 2 train.py")
    if args.out is not None and args.out.exists() and not args.force:
        raise UserError(f"{args.out} exists; pass --force to overwrite it")
    repo = args.repo.resolve()
    if not repo.is_dir():
        raise UserError(f"--repo {args.repo} is not a directory")
    try:
        text, report = scaffold(command, repo, name=args.name,
                                contract_dir=args.out.resolve().parent if args.out else repo)  # fmt: skip
    except ScaffoldError as exc:
        raise UserError(str(exc)) from None
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=args.out.parent, prefix=f".{args.out.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, args.out)
    knobs = ", ".join(k.key for k in report.knobs) or "none"
    print(f"{report.framework} job {report.script}: knobs {knobs}; horizon flag {report.steps_key}; "
          f"{len(report.left_out)} flag(s) left out, {len(report.candidates)} candidate(s)"
          + ("" if report.uses_probe else "; no probe: trials are measured coarsely")
          + (f"; draft written to {args.out}" if args.out else ""), file=sys.stderr)  # fmt: skip
    return 0
