"""The prompt of a model trained on the database (`schedlang train`), and the file that marks its
folder as one.

A model trained here reads a short prompt: the quality it is asked for, the op as `schedlang show`
prints it and the target's facts; it answers with a ```schedlang block. The dataset's lines
(schedlang.learn.dataset) are made with `compact_messages` and the proposer asks with it, so the
training prompts and the asking prompts are the same text.

    [quality: best]
    Target: CPU (llvm, znver4): 2 cores, 512-bit SIMD (16 x float32), ...
    op matmul (examples/matmul.py, M=64, N=64, K=64)
    buffers:
    ...

The quality is the schedule's rank among its op's verified records, as TLM (OSDI'24) conditions
on it: `best` is the fastest record, `good` one within 1.25x of it, `fair` within 2x, `slow` the
rest. A trained model is asked for `best`.

The folder holds `schedlang-model.json` (`TRAINED_FILE`): how the model was trained (the dataset's
schema, the prompt, the qualities), and the run's figures. Any other causal LM is asked with the
full prompt (schedlang.llm.messages.build_messages).
"""

from __future__ import annotations

import json
from pathlib import Path

TRAINED_FILE = "schedlang-model.json"
PROMPT_STYLE = "compact-1"  # the prompt below; a change to it is a new style
QUALITIES = ("best", "good", "fair", "slow")
ASKED_QUALITY = "best"


def quality_of(relative: float, rank: int) -> str:
    """The quality token of a record `relative` times as fast as its op's fastest (1.0 for the
    fastest itself), of rank `rank` (1: the fastest)."""
    if rank == 1:
        return "best"
    if relative >= 0.8:
        return "good"
    return "fair" if relative >= 0.5 else "slow"


def compact_prompt(op_text: str, target_facts: str, quality: str = ASKED_QUALITY) -> str:
    return f"[quality: {quality}]\nTarget: {target_facts.strip()}\n{op_text.strip()}\n"


def compact_messages(
    op_text: str, target_facts: str, quality: str = ASKED_QUALITY
) -> list[dict[str, str]]:
    """The chat a trained model is asked (and trained) with: one user turn."""
    return [{"role": "user", "content": compact_prompt(op_text, target_facts, quality)}]


def trained_info(model: str | Path) -> dict | None:
    """What `schedlang train` wrote about the model in folder `model`; None for any other model
    (a hub id, a folder without the file, a file that is not JSON)."""
    path = Path(model).expanduser() / TRAINED_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("prompt") == PROMPT_STYLE else None
