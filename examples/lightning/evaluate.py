"""Downstream evaluation of the Lightning example: held-out perplexity of a run's final weights.

    python evaluate.py --weights DIR [--sequences 64]

``DIR/model.ckpt`` is Lightning's own checkpoint of the final weights (``InfraRSICallback`` writes it when the
launcher sets ``INFRARSI_FINAL_WEIGHTS_DIR``); the module is rebuilt from its saved hyper-parameters with
``load_from_checkpoint`` and put in eval mode. The sequences come from the example's Markov language with a
seed neither training nor validation uses. Prints one JSON line: ``{"perplexity": …, "cross_entropy": …}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from infrarsi.probe.integrations.lightning import FINAL_WEIGHTS_FILE
from train import LanguageModel, MarkovData

HELDOUT_SEED = 3
"""Training draws with seed 1, validation with seed 2."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=Path, required=True, help="directory holding model.ckpt")
    parser.add_argument("--sequences", type=int, default=64)
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error("--sequences must be positive")
    checkpoint = args.weights / FINAL_WEIGHTS_FILE
    if not checkpoint.is_file():
        print(f"evaluate.py: no final weights at {checkpoint}", file=sys.stderr)
        return 2
    module = LanguageModel.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=False)
    module.eval()
    hp = module.hparams
    data = MarkovData(hp.vocab_size, hp.seq_len, batch_size=1, train_sequences=1, val_sequences=1)
    ids = data._sequences(args.sequences, seed=HELDOUT_SEED)  # (N, T+1)
    with torch.no_grad():
        ce = float(module._loss({"input_ids": ids[:, :-1], "labels": ids[:, 1:]}))
    print(json.dumps({"perplexity": math.exp(ce), "cross_entropy": ce, "sequences": args.sequences}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
