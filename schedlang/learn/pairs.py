"""What a model is trained on: a corpus (a tuning database or a dataset file) as prompt -> answer
pairs, and a tokenizer trained on their text.

A pair's prompt is the chat a trained model is asked with (schedlang.llm.trained.compact_messages),
conditioned on the record's quality; its answer is the schedule in a ```schedlang block, then the
end of the turn. Only the answer's tokens are learnt (`Encoded.labels` is -100 on the prompt).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from schedlang.core.diagnostics import SchedlangError
from schedlang.learn.dataset import Sample, build_samples, read_dataset
from schedlang.llm.backend import CLOSE_FENCE, FENCE
from schedlang.llm.trained import compact_messages

SQLITE_MAGIC = b"SQLite format 3\x00"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Pair:
    messages: tuple[dict[str, str], ...]  # the chat, up to the answer
    answer: str  # the ```schedlang block


@dataclass(frozen=True)
class Encoded:
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]  # -100 where the loss does not look (the prompt)


def load_corpus(source: Path) -> tuple[list[Sample], str]:
    """The samples of `source`, a tuning database or a dataset file (JSON lines), and what it is;
    only the `train` split of a dataset."""
    try:
        with source.open("rb") as handle:
            head = handle.read(len(SQLITE_MAGIC))
    except OSError as err:
        raise SchedlangError(f"cannot read the corpus {source}: {err.strerror or err}") from None
    if head == SQLITE_MAGIC:
        from schedlang.store.db import Database

        with Database(source, read_only=True) as db:
            samples, _ = build_samples(db)
        return samples, "database"
    samples = [s for s in read_dataset(source) if s.split == "train"]
    if not samples:
        raise SchedlangError(f"the dataset {source} has no `train` sample: all are held out")
    return samples, "dataset"


def pairs_of(samples: Iterable[Sample]) -> list[Pair]:
    return [
        Pair(
            tuple(compact_messages(s.op, s.target_facts, s.quality)),
            f"{FENCE}\n{as_decoded(s.schedule, s.op).strip()}\n{CLOSE_FENCE}",
        )
        for s in samples
    ]


def as_decoded(schedule: str, op_text: str) -> str:
    """The schedule as per-statement decoding writes it (schedlang.llm.stepwise): a `block NAME:`
    header only where a statement schedules another block than the one before it, the first
    block being the op's default (its only block, else its only reduction block, as the checker
    reads statements before any header); a header left out, its statements are not indented."""
    current = _default_block(op_text)
    out: list[str] = []
    dedent = False
    for line in schedule.strip().splitlines():
        if line.startswith("block ") and line.endswith(":"):
            block = line[len("block ") : -1].strip()
            dedent = block == current
            current = block
            if dedent:
                continue
        out.append(line.removeprefix("  ") if dedent else line)
    return "\n".join(out) + "\n"


def _default_block(op_text: str) -> str | None:
    """The block statements before any header schedule, from `schedlang show`'s text: each
    `block NAME  (…)` line, then its loops, one a line (`  i  64  spatial`)."""
    blocks: dict[str, bool] = {}  # name -> has a reduce loop
    name = None
    for line in op_text.splitlines():
        if line.startswith("block "):
            name = line.split()[1]
            blocks[name] = False
        elif name is not None and line.startswith("  ") and line.split()[-1:] == ["reduce"]:
            blocks[name] = True
        elif not line.startswith("  "):
            name = None
    if len(blocks) == 1:
        return next(iter(blocks))
    reductions = [block for block, reduces in blocks.items() if reduces]
    return reductions[0] if len(reductions) == 1 else None


def encode(pair: Pair, tokenizer, max_length: int) -> Encoded | None:
    """The pair's token ids with the end of the turn after the answer; None when longer than
    `max_length` tokens."""
    prompt = tokenizer.apply_chat_template(
        list(pair.messages), add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(pair.answer, add_special_tokens=False)["input_ids"]
    answer_ids = [*answer_ids, tokenizer.eos_token_id]
    if len(prompt_ids) + len(answer_ids) > max_length:
        return None
    return Encoded(tuple(prompt_ids + answer_ids), tuple([-100] * len(prompt_ids) + answer_ids))


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE trained on `texts`, as a transformers tokenizer with a ChatML template.

    Its normalizer and pre-tokenizer are exactly those transformers' Qwen2Tokenizer rebuilds when
    a qwen2 model's folder is loaded: with others, the reloaded tokenizer would split text
    differently from the trained one."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = CHATML
    return fast


def corpus_texts(pairs: Sequence[Pair]) -> list[str]:
    """The text a tokenizer is trained on: every prompt and answer, line by line."""
    texts = []
    for pair in pairs:
        for message in pair.messages:
            texts += [line + "\n" for line in message["content"].splitlines()]
        texts += [line + "\n" for line in pair.answer.splitlines()]
    return texts
