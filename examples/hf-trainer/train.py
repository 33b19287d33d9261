"""Train a small GPT-2 with the Hugging Face Trainer on synthetic text, written as the Trainer's docs write it.

    python train.py --output_dir out --max_steps 30 --per_device_train_batch_size 2 \
        --gradient_accumulation_steps 8 --use_cpu --logging_steps 1 --eval_strategy steps --eval_steps 10

Every ``TrainingArguments`` flag works as usual (``--bf16``, ``--optim adamw_torch_fused``, ...), plus the
few of ``ModelArguments`` and ``DataArguments`` below. The data is generated here, not downloaded: token
streams from a fixed random Markov chain whose next token is one of a few likely successors, so the loss
falls from ln(vocab) towards the chain's entropy and every run draws the same sequences.

The one line for InfraRSI is ``callbacks=[InfraRSICallback()]``; run by hand, the callback does nothing.
``resume_from_checkpoint=resume_checkpoint()`` lets verify restart the run from a mid-run checkpoint
(``verify.checkpoint_restart``); ``evaluate.py`` is the downstream evaluation (``verify.downstream``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch
from infrarsi.probe.integrations.hf import InfraRSICallback, resume_checkpoint
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the model is built from its config


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=128, metadata={"help": "residual width"})
    n_head: int = field(default=4, metadata={"help": "attention heads"})
    attn_implementation: str = field(default="eager", metadata={"help": "eager or sdpa"})


@dataclass
class DataArguments:
    vocab_size: int = field(default=256, metadata={"help": "tokens of the synthetic language"})
    seq_len: int = field(default=64, metadata={"help": "tokens per training sequence"})
    train_sequences: int = field(default=4096, metadata={"help": "size of the training set"})
    eval_sequences: int = field(default=32, metadata={"help": "size of the evaluation set"})
    successors: int = field(default=4, metadata={"help": "likely next tokens per token (the chain's entropy)"})


class MarkovText(torch.utils.data.Dataset):
    """``n`` sequences of a random Markov chain over the vocabulary, drawn once from ``seed``."""

    def __init__(self, args: DataArguments, n: int, seed: int) -> None:
        language = torch.Generator().manual_seed(1234)  # the same chain for training and evaluation
        successors = torch.randint(0, args.vocab_size, (args.vocab_size, args.successors), generator=language)
        g = torch.Generator().manual_seed(seed)
        choice = torch.randint(0, args.successors, (n, args.seq_len), generator=g)  # (N, T)
        ids = torch.empty(n, args.seq_len, dtype=torch.long)
        ids[:, 0] = torch.randint(0, args.vocab_size, (n,), generator=g)
        for t in range(1, args.seq_len):
            ids[:, t] = successors[ids[:, t - 1], choice[:, t]]
        self.ids = ids  # (N, T)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> int:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    torch.manual_seed(training_args.seed)
    config = GPT2Config(
        vocab_size=data_args.vocab_size,
        n_positions=data_args.seq_len,
        n_embd=model_args.n_embd,
        n_layer=model_args.n_layer,
        n_head=model_args.n_head,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = model_args.attn_implementation
    model = GPT2LMHeadModel(config)

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=MarkovText(data_args, data_args.train_sequences, seed=1),
        eval_dataset=MarkovText(data_args, data_args.eval_sequences, seed=2),
        callbacks=[InfraRSICallback()],
    )
    trainer.train(resume_from_checkpoint=resume_checkpoint())  # None unless verify resumes this run mid-way
    return 0


if __name__ == "__main__":
    sys.exit(main())
