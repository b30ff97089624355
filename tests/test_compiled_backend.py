"""The proposer's model on schedlang's own build (schedlang.llm.compiled, `--model-runtime
schedlang`): under greedy decoding it writes transformers' tokens, one call at a time and over a
whole `tune --proposer model` run with stepwise decoding; its KV cache is reused and rolled back
where a prompt shares its first tokens with what the cache holds; bad input is one error line.

The model is the tiny random-weight Qwen2 of schedlang.testing.tiny_model, built offline, its
layers' weights scaled up (`_sharpened`) so that greedy decoding writes varied text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedlang.cli import app
from schedlang.core.ops import load_op
from schedlang.llm.backend import FENCE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("llguidance")
    from schedlang.testing.tiny_model import build_tiny_model

    torch.set_num_threads(1)  # a tiny model runs several times faster on one thread here
    return _sharpened(build_tiny_model(tmp_path_factory.mktemp("tiny")))


def _sharpened(folder: Path, factor: float = 8.0) -> Path:
    """The layers' matrices scaled up: at initialization's scale the residual stream is mostly
    the last token's embedding and greedy decoding writes one token over and over; scaled, each
    token depends on the whole context, so that the two runtimes are compared on varied text."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(path)
    state = {k: v * factor if "layers." in k and v.ndim == 2 else v for k, v in state.items()}
    save_file(state, path, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def reference(folder):
    from schedlang.llm.local import TransformersBackend

    return TransformersBackend(str(folder), think=False, temperature=0.0, download=False)


@pytest.fixture(scope="module")
def compiled(folder):
    from schedlang.llm.compiled import CompiledBackend
    from schedlang.workflows.decoder_model import proposer_decoder

    return CompiledBackend(
        str(folder), proposer_decoder, think=False, temperature=0.0, max_length=512
    )


def _samples(backend, *args, **kwargs) -> list[tuple[str, int, str]]:
    samples, _ = backend.generate(*args, **kwargs)
    return [(s.text, s.tokens, s.finish) for s in samples]


def _chat(backend, content: str) -> str:
    return backend.chat_prompt([{"role": "user", "content": content}])


def test_greedy_tokens_are_transformers_tokens(reference, compiled):
    from schedlang.llm.grammar import Bounds, OpNames, decoding_grammar

    matmul = load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "32", "K": "32"})
    lark = decoding_grammar(OpNames.of(matmul), Bounds()).lark()
    chat = _chat(reference, "Schedule a matmul, please.")
    assert _chat(compiled, "Schedule a matmul, please.") == chat  # one tokenizer, one template
    prompts = [chat + FENCE + "\nsplit i by 4\n", chat + FENCE + "\n", chat]
    cases = [
        ((prompts, [None] * 3, 12), {}),
        # The prompts split where the chat ends (each with a rest: transformers pads an empty one
        # on the right, and writes from a padded position).
        ((prompts[:2], [None] * 2, 12), {"shared": chat}),
        ((prompts[2:], [None], 40, [FENCE, "\n\n\n"]), {}),  # stop strings
        ((prompts[1:2] * 2, [lark, None], 40), {"shared": chat}),  # a grammar on one row
    ]
    for args, kwargs in cases:
        expected = _samples(reference, *args, **kwargs)
        assert _samples(compiled, *args, **kwargs) == expected, (args[1:], kwargs)
    # The grammar's row is another text than the free one (the mask was applied).
    constrained, free = _samples(compiled, prompts[1:2] * 2, [lark, None], 40, shared=chat)
    assert constrained[0].strip() and constrained[0] != free[0], (constrained, free)


def test_the_cache_is_rolled_back_to_what_a_new_prompt_shares(reference, compiled):
    chat = _chat(compiled, "Schedule a softmax.")
    first = chat + FENCE + "\nsplit i by 8\n"
    _samples(compiled, [first], [None], 6)
    before = compiled.reused, compiled.prefilled, compiled.rollbacks
    # The same chat, another statement: the cache holds the chat and more; it is set back to
    # the tokens both prompts share, and only the rest is prefilled.
    second = chat + FENCE + "\nparallel i\n"
    got = _samples(compiled, [second], [None], 6)
    shared = len(compiled.tokenizer(chat + FENCE + "\n", add_special_tokens=False)["input_ids"])
    whole = len(compiled.tokenizer(second, add_special_tokens=False)["input_ids"])
    reused = compiled.reused - before[0]
    assert compiled.rollbacks == before[2] + 1
    assert shared <= reused < whole and compiled.prefilled - before[1] == whole - reused
    assert got == _samples(reference, [second], [None], 6)
    # The very prompt again: all of it from the cache but its last token, which is fed again.
    again = _samples(compiled, [second], [None], 6)
    assert again == got and compiled.reused - before[0] - reused == whole - 1


def test_a_tune_run_writes_transformers_answers_on_schedlang_runtime(folder, tmp_path, monkeypatch):
    """`tune --proposer model --model-runtime schedlang` with stepwise decoding, greedy: every
    call its model answered (the reasoning, each statement's step under its grammar, the speed
    measured before the run) is asked again of transformers, which writes the same tokens."""
    from schedlang.llm.compiled import CompiledBackend
    from schedlang.llm.local import TransformersBackend
    from schedlang.store.db import Database

    calls: list[tuple[tuple, dict, list]] = []
    backends: list[CompiledBackend] = []
    generate = CompiledBackend.generate

    def recorded(self, *args, **kwargs):
        samples, seconds = generate(self, *args, **kwargs)
        calls.append((args, kwargs, [(s.text, s.tokens, s.finish) for s in samples]))
        backends.append(self)
        return samples, seconds

    monkeypatch.setattr(CompiledBackend, "generate", recorded)
    budget = ["--max-new-tokens", "40", "--answer-tokens", "32"]
    result = CliRunner().invoke(
        app,
        ["tune", str(EXAMPLES / "matmul.py"), "-D", "M=32", "-D", "N=32", "-D", "K=32",
         "--proposer", "model", "--model", str(folder), "--model-runtime", "schedlang",
         "--decoding", "stepwise", "--temperature", "0", *budget, "--trials", "2",
         "--candidates-per-round", "2", "--db", str(tmp_path / "t.db")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "schedlang's build" in result.output  # the speed line says what runs the model
    with Database(tmp_path / "t.db") as db:
        records = [r for r in db.records() if not r.extra.get("baseline")]
    assert records and all(r.proposer == f"model:{folder.name}" for r in records)
    steps = [call for call in calls if any(lark is not None for lark in call[0][1])]
    assert len(steps) >= 3, calls  # statements written under their step's grammar
    backend = backends[0]
    assert backend.rollbacks >= 1 and backend.reused > backend.prefilled
    reference = TransformersBackend(
        str(folder), temperature=0.0, max_new_tokens=40, answer_tokens=32, download=False
    )
    for args, kwargs, answered in calls:
        assert _samples(reference, *args, **kwargs) == answered, (args[0][0][-200:], answered)


# --- bad input --------------------------------------------------------------------------------


def _tune(*options: str):
    return CliRunner().invoke(
        app,
        ["tune", str(EXAMPLES / "matmul.py"), "-D", "M=8", "-D", "N=8", "-D", "K=8",
         "--proposer", "model", "--trials", "1", *options],
    )  # fmt: skip


def _error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return next(line for line in result.output.splitlines() if line.startswith("error:"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--model-runtime", "vllm"], "error: unknown model runtime `vllm`"),
        (["--model-db", "x.db"], "error: --model-db goes with --model-runtime schedlang"),
        (["--model-max-length", "64"], "error: --model-max-length goes with --model-runtime"),
        (
            ["--model-runtime", "schedlang", "--endpoint", "http://127.0.0.1:9"],
            "error: --model-runtime schedlang runs the model here; --endpoint asks a server",
        ),
    ],
)
def test_runtime_options_that_do_not_go_together_are_one_error_line(options, message):
    assert _error_line(_tune("--model", "some/model", *options)).startswith(message)


def test_an_unsupported_architecture_is_one_error_line(folder, tmp_path):
    other = tmp_path / "mistral"
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    config |= {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    (other / "config.json").write_text(json.dumps(config))
    line = _error_line(_tune("--model", str(other), "--model-runtime", "schedlang"))
    assert line.startswith("error: unsupported architecture MistralForCausalLM"), line


def test_a_missing_model_db_is_one_error_line(folder, tmp_path):
    missing = tmp_path / "missing.db"
    line = _error_line(
        _tune("--model", str(folder), "--model-runtime", "schedlang", "--model-db", str(missing))
    )
    assert str(missing) in line and not missing.exists()


def test_spec_backend_without_the_build_says_where_it_comes_from(folder):
    from schedlang.core.diagnostics import SchedlangError
    from schedlang.llm.spec import ModelSpec

    with pytest.raises(SchedlangError, match="needs schedlang's decoder build"):
        ModelSpec(str(folder), runtime="schedlang").backend()


def test_model_db_builds_with_the_database_pass(folder, reference, tmp_path):
    """`--model-db DB`: the decoder built through ApplySchedlangDatabase (a database with no
    record of its kernels leaves them as TVM builds them); the tokens stay transformers'."""
    from schedlang.llm.compiled import CompiledBackend
    from schedlang.store.db import Database
    from schedlang.workflows.decoder_model import proposer_decoder

    Database(tmp_path / "empty.db").close()
    backend = CompiledBackend(
        str(folder), proposer_decoder, model_db=str(tmp_path / "empty.db"), think=False,
        temperature=0.0, max_length=256,
    )  # fmt: skip
    chat = _chat(backend, "Schedule a conv2d.")
    prompts = [chat + FENCE + "\n"]
    assert _samples(backend, prompts, [None], 8) == _samples(reference, prompts, [None], 8)
