"""Training a model on the tuning database (`schedlang train`): a small Qwen2 from scratch with a
tokenizer trained on the corpus, or LoRA on an existing causal LM (`base`, with `peft`).

The result is a folder any command takes as `--model DIR`: config, weights, tokenizer (with a ChatML
template), and `schedlang-model.json` (schedlang.llm.trained), which tells the proposer to ask it
with the prompt it was trained on. A LoRA run's adapter is merged into the base's weights, so the
folder is a plain causal LM too.

    result = train(Path("data.jsonl"), Path("model"), TrainSettings(steps=300, seed=1))

A run is repeatable: the batches of step n are drawn from the seed and n alone, and the weights
start from the seed. Every `checkpoint_every` steps, and at the end, DIR/checkpoint/ keeps the
weights (the adapter for LoRA), the optimizer's state and the losses so far; `resume=True` goes on
from it to `steps`, and ends where an uninterrupted run of the same settings ends.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from schedlang.core.diagnostics import SchedlangError, error_line
from schedlang.learn.dataset import DATASET_SCHEMA
from schedlang.learn.pairs import Encoded, corpus_texts, encode, load_corpus, pairs_of
from schedlang.llm.trained import ASKED_QUALITY, PROMPT_STYLE, QUALITIES, TRAINED_FILE

CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 300
    batch: int = 8
    learning_rate: float | None = None  # None: 2e-3 from scratch, 2e-4 with LoRA
    seed: int = 0
    checkpoint_every: int = 100
    max_length: int = 1024  # tokens of a pair, prompt and answer; longer pairs are left out
    threads: int = 1  # torch's: a small model runs fastest on one thread of a CPU
    # From scratch:
    vocab_size: int = 1024
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    # LoRA on a causal LM (a folder, or a hub id in the local cache):
    base: str | None = None
    lora_rank: int = 8

    @property
    def lr(self) -> float:
        return self.learning_rate or (2e-4 if self.base else 2e-3)


@dataclass(frozen=True)
class TrainResult:
    folder: Path
    steps: int
    losses: tuple[float, ...]  # one per step, of the whole run (a resumed one's included)
    samples: int
    skipped: int  # pairs longer than max_length
    seconds: float


def train(
    source: Path,
    out: Path,
    settings: TrainSettings = TrainSettings(),
    *,
    resume: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> TrainResult:
    """Train on `source` (a database or dataset) into folder `out` (the module's docstring);
    `progress(step, steps, loss)` after each step."""
    from schedlang.core.imports import allow_torch

    allow_torch()  # deferred by the CLI until a model is wanted
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its bars for each file saved

    started = time.perf_counter()
    checkpoint = out / CHECKPOINT
    _check_folder(out, resume)
    samples, _ = load_corpus(source)
    pairs = pairs_of(samples)
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    state = json.loads((checkpoint / "state.json").read_text()) if resume else {}
    if resume and _same_run(state.get("settings")) != _same_run(asdict(settings)):
        raise SchedlangError(
            f"{out}'s checkpoint was trained with other settings",
            f"its settings: {json.dumps(state.get('settings'))}",
        )
    tokenizer, model = _start(settings, pairs, checkpoint if resume else None)
    encoded = [e for e in (encode(p, tokenizer, settings.max_length) for p in pairs) if e]
    if not encoded:
        raise SchedlangError(
            f"every pair of the corpus is longer than {settings.max_length} tokens",
            "raise --max-length",
        )
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=settings.lr, weight_decay=0.0
    )
    if resume:
        optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
    losses: list[float] = list(state.get("losses", []))
    model.train()
    pad = tokenizer.pad_token_id
    for step in range(len(losses), settings.steps):
        input_ids, labels, mask = _batch(encoded, step, settings, pad)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(settings, step)
        optimizer.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, settings.steps, losses[-1])
        if (step + 1) % settings.checkpoint_every == 0 and step + 1 < settings.steps:
            _save_checkpoint(checkpoint, model, tokenizer, optimizer, settings, losses)
    _save_checkpoint(checkpoint, model, tokenizer, optimizer, settings, losses)
    model.eval()
    info = {
        "source": str(source),
        "samples": len(samples),
        "ops": len({s.op_key for s in samples}),
        "pairs": len(encoded),
    }
    _save_model(out, model, tokenizer, settings, _trained_file(info, settings, losses))
    seconds = time.perf_counter() - started
    return TrainResult(out, len(losses), tuple(losses), len(samples), len(pairs) - len(encoded),
                       seconds)  # fmt: skip


def _check_folder(out: Path, resume: bool) -> None:
    """A new run needs a folder without one; --resume, one with a checkpoint."""
    there = (out / CHECKPOINT / "state.json").is_file()
    if resume and not there:
        raise SchedlangError(f"nothing to resume: {out} holds no checkpoint", "leave out --resume")
    if not resume and there:
        raise SchedlangError(
            f"{out} holds a training run already",
            "--resume goes on from its checkpoint; or give -o another folder",
        )


def _trained_file(corpus: dict, settings: TrainSettings, losses: Sequence[float]) -> dict:
    """What TRAINED_FILE says: the prompt style, how the model was trained, and on what."""
    return {
        "prompt": PROMPT_STYLE,
        "dataset_schema": DATASET_SCHEMA,
        "qualities": list(QUALITIES),
        "asked": ASKED_QUALITY,
        **corpus,
        "settings": asdict(settings),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
    }


def _same_run(settings: dict | None) -> dict | None:
    """The settings a resumed run must share with its checkpoint's (not how long, nor how often
    it saves)."""
    if settings is None:
        return None
    return {k: v for k, v in settings.items() if k not in ("steps", "checkpoint_every")}


def _start(settings: TrainSettings, pairs: Sequence, checkpoint: Path | None):
    """The tokenizer and the model to train: from the checkpoint, else new (or the base's)."""
    if settings.base:
        return _lora_model(settings, checkpoint)
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from schedlang.learn.pairs import train_tokenizer

    if checkpoint is not None:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
        model = Qwen2ForCausalLM.from_pretrained(checkpoint, local_files_only=True)
        return tokenizer, model
    tokenizer = train_tokenizer(corpus_texts(pairs), settings.vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=settings.hidden_size * 4,
        num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads,
        num_key_value_heads=max(1, settings.heads // 2),
        max_position_embeddings=max(2048, settings.max_length),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return tokenizer, Qwen2ForCausalLM(config)


def _lora_model(settings: TrainSettings, checkpoint: Path | None):
    """The base model with LoRA adapters on its attention projections (from the checkpoint's
    adapter when resuming); SchedlangError when `base` is not a causal LM here."""
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
    except ImportError:
        raise SchedlangError(
            "LoRA (--base) needs peft, which is not installed",
            "install it with: pip install 'schedlang[train]'",
        ) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = str(Path(settings.base).expanduser()) if settings.base else ""
    try:
        tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise SchedlangError(
            f"{settings.base} is not a causal language model this machine has: "
            f"{error_line(err, first=True)}",
            "--base takes a folder of a Hugging Face causal LM (config, weights, tokenizer)",
        ) from None
    if tokenizer.chat_template is None:
        raise SchedlangError(f"{settings.base}'s tokenizer has no chat template")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if checkpoint is not None:
        return tokenizer, PeftModel.from_pretrained(model, checkpoint, is_trainable=True)
    config = LoraConfig(
        r=settings.lora_rank,
        lora_alpha=2 * settings.lora_rank,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    try:
        return tokenizer, get_peft_model(model, config)
    except ValueError as err:
        raise SchedlangError(
            f"cannot add LoRA adapters to {settings.base}: {error_line(err, first=True)}"
        ) from None


def _batch(encoded: Sequence[Encoded], step: int, settings: TrainSettings, pad: int):
    """Step `step`'s batch: the corpus shuffled once per pass from the seed and the pass's number,
    so that the batch depends on the seed and the step alone (a resumed run draws the same)."""
    import torch

    size = min(settings.batch, len(encoded))
    per_pass = max(1, len(encoded) // size)
    order = list(range(len(encoded)))
    random.Random(settings.seed * 1_000_003 + step // per_pass).shuffle(order)
    at = (step % per_pass) * size
    rows = [encoded[i] for i in order[at : at + size]]
    width = max(len(row.input_ids) for row in rows)
    ids = [list(r.input_ids) + [pad] * (width - len(r.input_ids)) for r in rows]
    labels = [list(r.labels) + [-100] * (width - len(r.labels)) for r in rows]
    mask = [[1] * len(r.input_ids) + [0] * (width - len(r.input_ids)) for r in rows]
    return torch.tensor(ids), torch.tensor(labels), torch.tensor(mask)


def _learning_rate(settings: TrainSettings, step: int) -> float:
    """A short linear warm-up, then a cosine decay to a tenth."""
    warmup = max(1, min(20, settings.steps // 10))
    if step < warmup:
        return settings.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _save_checkpoint(folder: Path, model, tokenizer, optimizer, settings, losses) -> None:
    """The weights (the adapter for LoRA), the optimizer and the losses, replacing the last
    checkpoint only once the new one is whole."""
    import torch

    saving = folder.with_name(f".{folder.name}.saving")
    shutil.rmtree(saving, ignore_errors=True)
    saving.mkdir(parents=True)
    model.save_pretrained(saving)
    tokenizer.save_pretrained(saving)
    torch.save(optimizer.state_dict(), saving / "optimizer.pt")
    state = {"settings": asdict(settings), "step": len(losses), "losses": losses}
    (saving / "state.json").write_text(json.dumps(state) + "\n")
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(saving, folder)
    shutil.rmtree(old, ignore_errors=True)


def _save_model(out: Path, model, tokenizer, settings: TrainSettings, info: dict) -> None:
    """The model as a plain causal LM (a LoRA adapter merged), its tokenizer and TRAINED_FILE,
    written beside the checkpoint; the files appear only once all are written."""
    saving = out / ".model.saving"
    shutil.rmtree(saving, ignore_errors=True)
    saving.mkdir(parents=True)
    final = model.merge_and_unload() if settings.base else model
    final.generation_config.eos_token_id = tokenizer.eos_token_id
    final.generation_config.pad_token_id = tokenizer.pad_token_id
    final.save_pretrained(saving)
    tokenizer.save_pretrained(saving)
    (saving / TRAINED_FILE).write_text(json.dumps(info, indent=1) + "\n")
    for path in saving.iterdir():
        os.replace(path, out / path.name)
    saving.rmdir()
