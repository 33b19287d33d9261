"""Downstream evaluation of the HF Trainer example: held-out perplexity of a run's final weights.

    python evaluate.py --weights DIR [--sequences 64]

``DIR`` is what ``save_pretrained`` wrote (``InfraRSICallback`` does it when the launcher sets
``INFRARSI_FINAL_WEIGHTS_DIR``). The sequences come from the example's own Markov language with a seed neither
the training nor the evaluation set uses. Prints one JSON line: ``{"perplexity": …, "cross_entropy": …}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
from train import DataArguments, MarkovText
from transformers import GPT2LMHeadModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HELDOUT_SEED = 3
"""Training draws with seed 1, the Trainer's evaluation set with seed 2."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=Path, required=True, help="a save_pretrained directory")
    parser.add_argument("--sequences", type=int, default=64)
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error("--sequences must be positive")
    if not (args.weights / "config.json").is_file():
        print(f"evaluate.py: no saved model at {args.weights}", file=sys.stderr)
        return 2
    model = GPT2LMHeadModel.from_pretrained(args.weights)
    model.eval()
    ids = MarkovText(DataArguments(), args.sequences, seed=HELDOUT_SEED).ids  # (N, T)
    with torch.no_grad():
        ce = float(model(input_ids=ids, labels=ids).loss)
    print(json.dumps({"perplexity": math.exp(ce), "cross_entropy": ce, "sequences": args.sequences}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
