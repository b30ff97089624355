"""A decoder LLM through tune-model, build-model and `generate --db`: the workflows and the CLI.

One tiny Qwen2 (examples/llm/tiny_qwen2.py with one layer, a cache of 16 tokens) is tuned once
per module from the command line at lengths 1 and 4, one trial each; build-model and generate
read that database. What is tested is what each command says and builds, not its speed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from schedlang import cli
from schedlang.models.decoder.sources import DecoderSource, is_decoder, open_model
from schedlang.models.model_file import Model

EXAMPLE = "examples/llm/tiny_qwen2.py"
SMALL = ["-D", "layers=1", "--max-length", "16"]
FAST = ["--trials", "1", "--repeat", "1", "--min-repeat-ms", "1", "--target", "llvm"]


def _cli(*args: str):
    return CliRunner().invoke(cli.app, list(args))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(the tune-model run, its database's path)."""
    db = str(tmp_path_factory.mktemp("decoder-cli") / "tune.db")
    result = _cli("tune-model", EXAMPLE, *SMALL, "--lengths", "1,4", "--db", db, *FAST)
    assert result.exit_code == 0, result.output
    return result, db


def test_the_rule_a_causal_lm_alone_or_a_folder_is_a_decoder(tmp_path):
    decoder = open_model(EXAMPLE, {"layers": "1"})
    assert isinstance(decoder, DecoderSource) and decoder.name == "tiny_qwen2"
    assert isinstance(open_model(str(tmp_path)), DecoderSource)  # a checkpoint folder
    # With its example input_ids (examples/models/qwen2.py), a causal LM goes to torch.export
    # at a fixed length, as before; so does any other model file.
    assert is_decoder(decoder.source) and not is_decoder((decoder.source, np.zeros((1, 4))))
    assert isinstance(open_model("examples/models/mlp.py"), Model)


def test_tune_model_lists_each_variable_with_its_lengths_and_each_kernel(tuned):
    result, _ = tuned
    lines = result.stdout.splitlines()
    # Kernels with a token count are tuned at a prompt's length too (16: the cache's length).
    assert "symbolic variable n: measured at 1, 4, 16" in lines
    assert "symbolic variable past: measured at 1, 4, 16" in lines
    # Prefill's attention is no task: it comes scheduled (attention_prefill.py).
    assert lines[0].startswith("decoder tiny_qwen2 on llvm: 19 kernels, a cache of 16 tokens")
    assert "not tuned: attention_prefill, written scheduled (fixed block sizes)" in lines
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  ")}
    assert rows["swiglu"][1] == "n" and rows["lm_head"][1] == "-"  # prefill's, decode's
    assert rows["lm_head"][-1] == "(static)"
    assert any(line.endswith("kernels scheduled") for line in lines)
    table = [line for line in lines if not line.startswith("build it with: ")]
    assert all(len(line) <= 80 for line in table), [line for line in table if len(line) > 80]
    # Every kernel scheduled (head_dim 16 = the cache's 16 positions left rotary, the cache
    # append and attention unscheduled before: "unscheduled: rotary: no template applies").
    assert not [x for x in result.stderr.splitlines() if x.startswith("unscheduled: ")]
    assert "19 of 19 kernels scheduled" in lines


def test_build_model_uses_the_tuned_schedules(tuned):
    result, db = tuned
    lines = result.stdout.splitlines()
    full = dict(line.split(" = ") for line in lines if " = " in line)  # cut name = full name
    full = {cut.strip(): name for cut, name in full.items()}
    rows = [line.split() for line in lines if line.startswith("  ") and " = " not in line]
    scheduled = {full.get(row[0], row[0]) for row in rows[1:] if row[2] != "none"}
    built = _cli("build-model", EXAMPLE, *SMALL, "--db", db)
    assert built.exit_code == 0, built.output
    rows = [line.split() for line in built.stdout.splitlines() if line.startswith("  ")]
    how = {row[0]: " ".join(row[1:]) for row in rows}
    from_db = {name for name, h in how.items() if h.startswith("schedlang record #")}
    assert scheduled and from_db == scheduled
    assert f"{len(scheduled)} of {len(how)} functions scheduled from the database" in built.stdout


def test_generate_with_the_database_gives_transformers_tokens(tuned):
    import torch

    _, db = tuned
    result = _cli("generate", EXAMPLE, *SMALL, "--db", db, "--prompt-tokens", "5",
                  "--new-tokens", "6", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["scheduled"]["from_database"] > 0
    model = open_model(EXAMPLE, {"layers": "1"}).source
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, 5).tolist()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=6, min_new_tokens=6,
            pad_token_id=0,
        )  # fmt: skip
    assert document["tokens"] == out[0, 5:].tolist()


@pytest.mark.parametrize("lengths", ["0", "1,x", "4,-3", "1,,4", "2.5"])
def test_lengths_that_are_not_positive_integers_are_one_error_line(lengths):
    result = _cli("tune-model", EXAMPLE, f"--lengths={lengths}", "--db", "unused.db")
    assert result.exit_code == 1
    message = result.stderr.strip()
    assert message.startswith("error: --lengths: ") and "positive integer" in message
    assert len(message.splitlines()) == 1


def test_decoder_options_on_a_fixed_shape_model_are_one_error_line():
    result = _cli("tune-model", "examples/models/mlp.py", "--max-length", "16", "--db", "x.db")
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("error: --max-length: for a decoder LLM only")
    # --lengths serves a model with symbolic shapes (tests/test_model_lengths.py): not this one
    result = _cli("tune-model", "examples/models/mlp.py", "--lengths", "1,4", "--db", "x.db")
    assert result.exit_code == 1
    assert "--lengths: examples/models/mlp.py has no symbolic dimension" in result.stderr


def test_tune_model_tables_cut_long_fused_names_to_fit_80_columns(capsys):
    from schedlang.cli.model import _print_plans, _print_summary

    names = [f"fused_matmul_add_multiply_tanh_add_multiply_multiply{i}" for i in range(3)]
    tasks = [SimpleNamespace(name=n, key=n, calls=12, flops=3.2e9) for n in names]
    plan = SimpleNamespace(
        templates=("matmul_tiled", "matmul_packed", "generic", "generic_rfactor"),
        kind="matmul", serial=True, generic_only=False, why_none="",
    )  # fmt: skip
    planned = SimpleNamespace(
        model="bert", target="llvm", tasks=tasks, plans=dict.fromkeys(names, plan), trials=64,
        lengths=(), variables=(),
    )  # fmt: skip
    _print_plans(planned)
    states = [
        SimpleNamespace(task=t, time_s=1e-3 * (i + 1), latency_s=1e-4, trials=20, error=None)
        for i, t in enumerate(tasks)
    ]
    _print_summary(SimpleNamespace(states=states, trials=60, estimate_s=6e-3, unmeasured=0))
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if " = " not in line]
    assert all(len(line) <= 80 for line in table), [line for line in table if len(line) > 80]
    for name in names:  # the full name once, beside its cut form
        assert f" = {name}" in out
    cut = {line.split(" = ")[0].strip() for line in out.splitlines() if " = " in line}
    assert len(cut) == len(names)  # the cut names stay distinct (their numbers kept)
