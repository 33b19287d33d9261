"""A repository that pretrains a tiny GPT from scratch with LitGPT's ``litgpt pretrain``, the way LitGPT's
documentation does it for your own text (issue 35, item 5): a config file in LitGPT's own format (``model_config``,
``data: {class_path: litgpt.data.TextFiles, …}``, ``train:``, ``eval:``), plain ``.txt`` files, and a tokenizer
directory. Nothing of InfraRSI in it, and nothing of LitGPT copied: LitGPT is the pinned release in its own
virtual environment (``make litgpt-venv``; ``tests/support/litgpt-requirements.txt`` says why).

``make_litgpt_repo(path)`` writes and commits the repository, then runs its ``prepare.py`` with LitGPT's Python:
the text files and a byte-pair tokenizer trained on them (``tokenizers``), and LitGPT's own ``TextFiles``
preprocessing (the step ``litgpt pretrain`` runs on its first call) — all under ``data/`` and
``checkpoints/``, which ``.gitignore`` excludes, as prepared data is. ``golden_command()`` is how its README
runs it with that environment: ``.venv-litgpt/bin/litgpt pretrain --config pretrain.yaml``. The horizon is
LitGPT's token budget (``train.max_tokens``), and the global batch of 8 sequences is 4 micro-batches of 2, so a
larger micro-batch is a real speed-up for the search to find.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LITGPT_VENV = REPO_ROOT / ".venv-litgpt"
LITGPT = LITGPT_VENV / "bin" / "litgpt"

CONFIG = """\
# LitGPT pretraining config (the format of LitGPT's config_hub/pretrain/*.yaml): a tiny GPT from scratch
model_name: tiny-gpt
model_config:
  name: tiny-gpt
  block_size: 64
  vocab_size: 256
  padded_vocab_size: 256
  n_layer: 2
  n_head: 2
  n_embd: 64
  bias: false
out_dir: out/pretrain
precision: 32-true
data:
  class_path: litgpt.data.TextFiles
  init_args:
    train_data_path: data/text
    num_workers: 0
tokenizer_dir: checkpoints/tiny-gpt
train:
  global_batch_size: 8
  micro_batch_size: 2
  max_seq_length: 64
  max_tokens: 15360
  log_interval: 1
  save_interval: 100000
  lr_warmup_steps: 2
  max_norm: 1.0
  min_lr: 0.0001
eval:
  interval: 10
  max_iters: 2
  initial_validation: false
  final_validation: true
optimizer:
  class_path: torch.optim.AdamW
  init_args:
    lr: 0.003
devices: 1
num_nodes: 1
logger_name: csv
seed: 42
"""

PREPARE = '''\
"""Text files, a tokenizer trained on them, and LitGPT's TextFiles preprocessing (what `litgpt pretrain` does
on its first run), so that every run reads the same prepared shards."""
import json
import random
from pathlib import Path

import yaml
from litgpt.data import TextFiles
from litgpt.tokenizer import Tokenizer
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers


def main() -> None:
    config = yaml.safe_load(Path("pretrain.yaml").read_text())
    text_dir = Path(config["data"]["init_args"]["train_data_path"]).resolve()  # litdata misreads a relative path
    text_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(200)]
    for part in range(4):  # LitGPT takes the first file for validation
        sentence = [rng.choice(words) for _ in range(12)]
        # a repeated sentence with a few words varied: something a tiny model learns within a few dozen steps
        text = " ".join(w if rng.random() > 0.1 else rng.choice(words) for _ in range(1500) for w in sentence)
        (text_dir / f"part{part}.txt").write_text(text)

    tokenizer_dir = Path(config["tokenizer_dir"]).resolve()
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    bpe = HFTokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train(sorted(str(p) for p in text_dir.glob("*.txt")),
              trainers.BpeTrainer(vocab_size=config["model_config"]["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"]))
    bpe.save(str(tokenizer_dir / "tokenizer.json"))
    (tokenizer_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}))

    data = TextFiles(train_data_path=text_dir, num_workers=0)
    data.connect(tokenizer=Tokenizer(tokenizer_dir), batch_size=config["train"]["micro_batch_size"],
                 max_seq_length=config["train"]["max_seq_length"])
    data.prepare_data()


if __name__ == "__main__":  # litdata's workers are spawned: they import this file again
    main()
'''


def install_reason() -> str | None:
    """``None`` when ``litgpt`` is installed in ``.venv-litgpt`` (installed now with ``make litgpt-venv`` when
    missing), else why it cannot be."""
    if LITGPT.is_file():
        return None
    if shutil.which("make") is None:
        return "LitGPT is not installed in .venv-litgpt and `make` is missing to install it (make litgpt-venv)"
    try:
        proc = subprocess.run(["make", "-C", str(REPO_ROOT), "litgpt-venv"], capture_output=True, text=True,
                              timeout=1800)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "make litgpt-venv took more than 30 minutes"
    if proc.returncode != 0 or not LITGPT.is_file():
        return f"make litgpt-venv could not install LitGPT: {(proc.stderr or proc.stdout).strip()[-400:]}"
    return None


OFFLINE = {"LITDATA_DISABLE_VERSION_CHECK": "1"}
"""litdata asks PyPI for a newer release on import unless told not to: a run here reaches no network."""


def golden_command() -> list[str]:
    """The command the repository's README gives: the environment's ``litgpt`` on the config file, offline."""
    return [*(f"{k}={v}" for k, v in OFFLINE.items()), str(LITGPT), "pretrain", "--config", "pretrain.yaml"]


def make_litgpt_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "pretrain.yaml").write_text(CONFIG)
    (path / "prepare.py").write_text(PREPARE)
    (path / ".gitignore").write_text("data/\ncheckpoints/\nout/\n")
    (path / "README.md").write_text("python prepare.py\nLITDATA_DISABLE_VERSION_CHECK=1 litgpt pretrain --config pretrain.yaml\n")
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "tiny GPT pretrained with LitGPT"], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFRARSI_", "PYTHONPATH"))} | OFFLINE
    subprocess.run([str(LITGPT_VENV / "bin" / "python"), "prepare.py"], cwd=path, check=True, capture_output=True,
                   timeout=600, env=env)  # fmt: skip
    return path
