"""`schedlang generate`: greedy decoding on a decoder LLM built by schedlang, with its speed."""

from __future__ import annotations

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
        typer.Option("--max-length", help="The KV cache's length (default: prompt + new)."),
    ] = None,
    target: TargetOpt = "llvm",
    defines: DefineOpt = None,
    seed: SeedOpt = 0,
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
    decoder, result = generate_random_prompt(
        source,
        prompt_tokens,
        new_tokens,
        max_length=max_length,
        seed=seed,
        target=resolve_target(target),
    )
    figures = {
        "architecture": decoder.config.architecture,
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": len(result.tokens),
        "tokens": list(result.tokens),
        "prefill_tokens_per_s": result.prefill_tokens_per_s,
        "decode_tokens_per_s": result.decode_tokens_per_s,
    }
    if json_output:
        emit_json({"ok": True, **figures})
        return
    typer.echo(f"{decoder.config.architecture}: {' '.join(map(str, result.tokens))}")
    typer.echo(f"prefill {result.prompt_tokens} tokens: {result.prefill_tokens_per_s:.1f} tokens/s")
    steps = len(result.tokens) - 1
    typer.echo(f"decode {steps} tokens: {result.decode_tokens_per_s:.1f} tokens/s")
