"""Downstream evaluation of the reference GPT: held-out perplexity of a run's final weights.

    python evaluate.py --launch-file LAUNCH.yaml --weights DIR [--sequences 64]

Reads ``DIR/model.pt`` (written by ``train.py`` when ``INFRARSI_FINAL_WEIGHTS_DIR`` is set), builds the model the
launch file describes with the code beside it (a candidate's patched ``model.py`` in its worktree), puts it in
eval mode as a deployment would, and prints one JSON line: ``{"perplexity": …, "cross_entropy": …}``. The
sequences are a range of the same generated corpus that neither training nor the in-run eval batch reads
(``data.HELDOUT_OFFSET``). The contracts' ``verify.downstream`` runs it; locked (not in any study's scope).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from checkpoint import FINAL_WEIGHTS
from config import load_launch
from data import HELDOUT_OFFSET, MarkovCorpus
from model import GPT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch-file", type=Path, required=True)
    parser.add_argument("--weights", type=Path, required=True, help="directory holding model.pt")
    parser.add_argument("--sequences", type=int, default=64, help="held-out sequences to score")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    if args.sequences < 1 or args.batch < 1:
        parser.error("--sequences and --batch must be positive")
    weights = args.weights / FINAL_WEIGHTS
    if not weights.is_file():
        print(f"evaluate.py: no final weights at {weights}", file=sys.stderr)
        return 2
    cfg = load_launch(args.launch_file)
    torch.set_num_threads(cfg.knobs.intra_op_threads)
    model = GPT(cfg.model, attention=cfg.knobs.attention)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    corpus = MarkovCorpus(cfg.run.seed, cfg.model.vocab_size, cfg.model.seq_len)
    seqs = torch.from_numpy(corpus.sequences(HELDOUT_OFFSET, args.sequences))  # (N, T+1)
    total = 0.0
    with torch.no_grad():
        for chunk in seqs.split(args.batch):
            total += float(model(chunk[:, :-1], chunk[:, 1:]).ce) * chunk.shape[0]
    ce = total / args.sequences
    print(json.dumps({"perplexity": math.exp(ce), "cross_entropy": ce, "sequences": args.sequences}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
