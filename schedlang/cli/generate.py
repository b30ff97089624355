"""`schedlang generate`: greedy decoding on a decoder LLM built by schedlang, with its speed."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Annotated

import typer

from schedlang.cli.app import command, emit_json, set_output
from schedlang.cli.options import DefineOpt, JsonOpt, SeedOpt, TargetOpt

LengthOpt = Annotated[int, typer.Option(help="A positive number of tokens.")]


@command("generate")
def generate_command(
    model: Annotated[
        str,
        typer.Argument(
            help="A checkpoint folder (config.json, *.safetensors), or a model file returning "
            "a transformers causal LM (FILE.py or FILE.py:NAME).",
            metavar="MODEL",
        ),
    ],
    prompt_tokens: Annotated[
        int, typer.Option("--prompt-tokens", help="Prompt length: random token ids.")
    ] = 128,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Tokens to generate.")] = 128,
    max_length: Annotated[
        int | None,
        typer.Option(
            "--max-length",
            help="The KV cache's length (default: prompt + new; with --db, the model's maximum "
            "up to 2048, as tune-model's: the one the schedules were tuned for).",
        ),
    ] = None,
    target: TargetOpt = "llvm",
    defines: DefineOpt = None,
    seed: SeedOpt = 0,
    db_path: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Build with this tuning database's schedules (`schedlang tune-model MODEL "
            "--db DB`); without it, the kernels are built unscheduled.",
        ),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Build a Qwen2 or Llama decoder (prefill and decode sharing a KV cache), generate greedily
    after a random prompt, and print the tokens and the prefill and decode tokens/s."""
    from schedlang.core.ops import parse_defines, split_op_spec
    from schedlang.core.target import resolve_target
    from schedlang.models.decoder import generate_random_prompt
    from schedlang.models.decoder.sources import open_source

    set_output(json_output=json_output)
    path, name = split_op_spec(model)
    source = open_source(path, parse_defines(defines or []), name)
    tgt = resolve_target(target)
    with ExitStack() as stack:
        schedule = None
        if db_path is not None:  # an explicit database: a missing file is an error
            from schedlang.models.graph import ApplySchedlangDatabase
            from schedlang.workflows.database import database

            schedule = ApplySchedlangDatabase(
                stack.enter_context(database(db_path, read_only=True)), tgt
            )
        decoder, result = generate_random_prompt(
            source, prompt_tokens, new_tokens, max_length=max_length, seed=seed, target=tgt,
            schedule=schedule,
        )  # fmt: skip
    applied = list(schedule.applied) if schedule is not None else []
    scheduled = sum(item.how == "schedlang" for item in applied)
    figures = {
        "architecture": decoder.config.architecture,
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": len(result.tokens),
        "tokens": list(result.tokens),
        "prefill_tokens_per_s": result.prefill_tokens_per_s,
        "decode_tokens_per_s": result.decode_tokens_per_s,
    }
    if db_path is not None:
        figures["scheduled"] = {"from_database": scheduled, "functions": len(applied)}
    if json_output:
        emit_json({"ok": True, **figures})
        return
    if db_path is not None:
        typer.echo(f"{scheduled} of {len(applied)} kernels scheduled from {db_path}")
    typer.echo(f"{decoder.config.architecture}: {' '.join(map(str, result.tokens))}")
    typer.echo(f"prefill {result.prompt_tokens} tokens: {result.prefill_tokens_per_s:.1f} tokens/s")
    steps = len(result.tokens) - 1
    typer.echo(f"decode {steps} tokens: {result.decode_tokens_per_s:.1f} tokens/s")
