"""Language models writing schedlang: prompts, the decoding grammar, constrained sampling, the
transformers and HTTP backends, the repair round, and the model proposer inside the tuner.

Everything runs offline on a tiny random-weight Qwen2 built here, with a tokenizer trained here on
schedlang-ish text, saved to a folder and loaded back through the real loading path.
"""

from __future__ import annotations

import glob
import json
import socket
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
llguidance = pytest.importorskip("llguidance")

from typer.testing import CliRunner  # noqa: E402

from schedlang.checker.check import check  # noqa: E402
from schedlang.cli import app  # noqa: E402
from schedlang.core.diagnostics import SchedlangError  # noqa: E402
from schedlang.core.ops import from_primfunc, load_op  # noqa: E402
from schedlang.core.target import resolve_target  # noqa: E402
from schedlang.lang import nodes, statements  # noqa: E402
from schedlang.lang.syntax import parse  # noqa: E402
from schedlang.llm.backend import Completion, extract_answer  # noqa: E402
from schedlang.llm.feedback import render_history  # noqa: E402
from schedlang.llm.grammar import Bounds, OpNames, decoding_grammar, schedlang_grammar  # noqa: E402
from schedlang.llm.local import TransformersBackend  # noqa: E402
from schedlang.llm.messages import build_messages, examples, op_kind, schedlang_reference  # noqa: E402
from schedlang.llm.openai_backend import OpenAIBackend, chat_completions_url  # noqa: E402
from schedlang.llm.proposer import ModelProposer  # noqa: E402
from schedlang.propose.interface import Context, Proposal  # noqa: E402
from schedlang.store.db import Database  # noqa: E402
from schedlang.store.records import Record, Status  # noqa: E402
from schedlang.testing.tiny_model import JsonHandler, build_tiny_model  # noqa: E402
from schedlang.tuning.tune import Settings, tune  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SAMPLES = 20


# --- a tiny model, built offline ------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)  # a tiny model runs several times faster on one thread
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def backend(tiny_dir) -> TransformersBackend:
    return TransformersBackend(str(tiny_dir), think=False, max_new_tokens=256, download=False)


@pytest.fixture(scope="session")
def matmul():
    return load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "32", "K": "32"})


@pytest.fixture(scope="session")
def grammar(matmul):
    return decoding_grammar(OpNames.of(matmul), Bounds())


def elementwise_op():
    from tvm import te

    a = te.placeholder((64, 64), "float32", name="A")
    b = te.placeholder((64, 64), "float32", name="B")
    c = te.compute((64, 64), lambda i, j: te.max(a[i, j] + b[i, j], 0.0), name="C")
    return from_primfunc(te.create_prim_func([a, b, c]), "add_relu")


def parses(text: str | None) -> bool:
    try:
        parse(text or "")
    except SchedlangError:
        return False
    return text is not None


def test_the_tokenizer_reloads_with_the_ids_it_was_trained_with(tiny_dir, backend):
    from tokenizers import Tokenizer

    trained = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    text = "block C:\n  tile i, j by 2x2; unroll k  # the seed's advice\n```"
    assert backend.tokenizer(text)["input_ids"] == trained.encode(text).ids
    assert backend.vocab_size > len(backend.tokenizer)


# --- prompts --------------------------------------------------------------------------------------


def test_the_reference_documents_every_statement_of_the_grammar():
    reference = schedlang_reference()
    for keyword in statements.KEYWORDS:
        assert f"- `{keyword} " in reference, keyword
    assert "split AXIS by FACTOR[, FACTOR …]" in reference
    assert "decompose_reduction [BLOCK] at AXIS" in reference
    assert all(axis in reference for axis in nodes.THREAD_AXES)


def _example_op(example):
    spec = example.text.splitlines()[0].removeprefix("# op: ").split()
    if spec == ["elementwise"]:
        return elementwise_op()
    return load_op(str(EXAMPLES / spec[0]), dict(item.split("=") for item in spec[1:]))


@pytest.mark.parametrize("example", examples(), ids=lambda e: e.name)
def test_prompt_examples_parse_and_check_clean_on_their_op(example):
    op = _example_op(example)
    target = resolve_target("cuda" if example.name.endswith("gpu") else "llvm")
    result = check(parse(example.text, example.name), op.func, target, template_ok=True)
    assert result.ok, [d.message for d in result.diagnostics]
    assert op_kind(op) == example.name.split("-")[0]


def test_the_prompt_shows_the_op_target_hint_examples_and_history(matmul):
    target = resolve_target("llvm")
    history = [
        _record(matmul, "tile i, j by 4x4\n", Status.OK, gflops=3.5),
        _record(
            matmul,
            "unroll k.i\n",
            Status.CHECK_ERROR,
            reason="no axis k.i",
            diagnostics="<answer>:1:8: error: block C has no axis `k.i`\n  note: axes: i, j, k",
        ),
    ]
    system, user = build_messages(Context(matmul, target, "tile i, j by 2x2"), history)
    assert "schedlang reference" in system["content"]
    content = user["content"]
    assert "block C  (reads A, B; writes C)" in content
    assert target.describe() in content
    assert "Hint from the user: tile i, j by 2x2" in content
    assert "Example (matmul on a CPU)" in content and "# op:" not in content
    assert "3.50 GFLOP/s" in content and "block C has no axis `k.i`" in content
    conv = load_op(str(EXAMPLES / "conv2d.py"), {"C": "16", "H": "16", "W": "16", "K": "16"})
    conv_prompt = build_messages(Context(conv, resolve_target("cuda")))[1]["content"]
    assert "Example (conv on a GPU)" in conv_prompt


def _record(op, schedule, status, *, gflops=None, reason="", diagnostics=None):
    from schedlang.core.opinfo import flop_count
    from schedlang.store.records import op_key

    median = flop_count(op.func) / gflops / 1e9 if gflops else None
    return Record(
        op_key=op_key(op.func),
        op_name=op.name,
        target_key="{}",
        target={},
        schedule=schedule,
        knobs={},
        template=None,
        status=status,
        reason=reason,
        latencies_s=(median,) if gflops else (),
        median_s=median,
        gflops=gflops,
        proposer="model:test",
        seed=0,
        created_at=0.0,
        schedlang_version="0",
        tvm_version="0",
        extra={"diagnostics": diagnostics} if diagnostics else {},
    )


def test_history_keeps_the_fastest_and_the_latest(matmul):
    records = [_record(matmul, f"split i by {n}\n", Status.OK, gflops=float(n)) for n in (1, 8, 2)]
    records += [_record(matmul, f"split j by {n}\n", Status.WRONG, reason="wrong") for n in (3, 5)]
    text = render_history(records, op=matmul, target=resolve_target("llvm"), best_n=2, latest_n=2)
    assert text.index("8.00 GFLOP/s") < text.index("2.00 GFLOP/s")
    assert "1.00 GFLOP/s" not in text
    assert "split j by 5" in text and "wrong: wrong" in text


def test_extract_answer_takes_the_last_schedlang_fence():
    reply = (
        "think ```py\nx = 1\n``` more\n```schedlang\nsplit i by 4\n```\n```schedlang\nunroll k\n"
    )
    assert extract_answer(reply) == "unroll k\n"
    assert extract_answer("```\nsplit i by 2\n```") == "split i by 2\n"
    assert extract_answer("no fence at all") is None


# --- the decoding grammar -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def full_grammar():
    return decoding_grammar()


def _accepts(backend, lark: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(
        backend.lltokenizer(), llguidance.LLMatcher.grammar_from_lark(lark), log_level=0
    )
    assert not matcher.is_error(), matcher.get_error()
    tokens = backend.lltokenizer().tokenize_str(text)
    return matcher.consume_tokens(tokens) and matcher.is_stopped()


def test_the_decoding_grammar_follows_the_grammar_file(full_grammar):
    assert full_grammar.stale == ()
    for keyword in statements.KEYWORDS:
        assert f'"{keyword}"' in full_grammar.rules, keyword
    # Every statement, each once (the grammar lists them in its own order).
    rules = schedlang_grammar().statement_rules()[1:]
    assert sorted(rules) == sorted(statements.KEYWORDS[1:])


def test_a_step_grammar_with_patterns_is_what_llguidance_masks_to(backend, matmul):
    """A step's patterns (a reorder of any order, a tile by any factors) are terminals of the
    step grammar; llguidance admits their texts and nothing outside them."""
    from schedlang.llm.stepwise import StepDecoder

    decoder = StepDecoder(matmul, resolve_target("llvm"))
    state = decoder.state(["tile i, j by 8x8", "split k by 4"])
    lark = StepDecoder.grammar(decoder.candidates(state), state.can_end)
    assert "STEP0: " in lark
    for text, admitted in [
        ("reorder i.o, j.o, k.o, i.i, k.i, j.i\n", True),  # six loops, any order
        ("reorder k.i, i.o\n", True),
        ("tile i.i, j.i by 2x8\n", True),  # a factor and the extent
        ("split k.o by 2\n", True),
        ("reorder i.o, q\n", False),  # not a loop
        ("reorder i.o\n", False),  # one loop
        ("tile i.i, j.i by 3x8\n", False),  # 3 does not divide 8
        ("```", True),
    ]:
        assert _accepts(backend, lark, text) is admitted, text


@pytest.mark.parametrize(
    "path", sorted(glob.glob(str(EXAMPLES / "*.sched"))), ids=lambda p: Path(p).name
)
def test_the_decoding_grammar_accepts_every_example(backend, full_grammar, path):
    text = Path(path).read_text()
    assert _accepts(backend, full_grammar.lark(), f"```schedlang\n{text}```")


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("tile i, j by 2x2  # 2x2 tiles\nunroll k", True),
        ("param TI in [4, 8]\ntile i, j by TI x 4", True),
        ("cache_read A global at i; decompose_reduction C at k", True),
        ("compute_at B k.o keep_unit_loops\ncache_write C global at j.0 keep_unit_loops", True),
        ("rfactor k.i factor_axis 1 as C_rf", True),
        ("rfactor k.i factor_axis1", False),
        ("cache_read A global keep_unit_loops", False),  # an option of `at`
        ("splitk by 4", False),  # the parser rejects a keyword glued to a name
        ("split i by4", False),
        ("cache_read A globalat i", False),
        ("tile i, j by TIxTJ", False),  # one name, `TIxTJ`
        ("tile i, j, k by 2x2", False),  # the parser's validation rejects these
        ("split i by *, *", False),
        ("split i by *", False),
        ("param T in pow2(8, 4)", False),
        ("param T in [0, 4]", False),
        ("pragma i unroll_explicit=1, unroll_explicit=0", False),
    ],
)
def test_the_decoding_grammar_admits_only_what_parses(backend, full_grammar, text, accepted):
    assert parses(text) is accepted
    assert _accepts(backend, full_grammar.lark(), f"```schedlang\n{text}\n```") is accepted


def test_the_per_op_grammar_admits_only_the_ops_names(backend, grammar):
    assert _accepts(backend, grammar.lark(), "```schedlang\nblock C:\n  tile i, j by 2x2\n```")
    assert not _accepts(backend, grammar.lark(), "```schedlang\nblock D:\n  unroll k\n```")
    assert not _accepts(backend, grammar.lark(), "```schedlang\nunroll q\n```")


# --- sampling -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sampled(backend, grammar, matmul):
    messages = build_messages(Context(matmul, resolve_target("llvm")))
    constrained = backend.complete(messages, SAMPLES, grammar, seed=1)
    free = backend.complete(messages, SAMPLES, None, seed=1)
    return constrained, free


def test_every_constrained_answer_parses(sampled):
    constrained, free = sampled
    rate = sum(parses(c.answer) for c in constrained)
    free_rate = sum(parses(c.answer) for c in free)
    print(f"parse rate: constrained {rate}/{SAMPLES}, unconstrained {free_rate}/{SAMPLES}")
    assert rate == SAMPLES
    assert all(c.constrained and c.finish == "stop" for c in constrained)
    assert all(c.tokens > 0 and c.mask_seconds > 0 for c in constrained)


def test_a_reasoning_model_thinks_then_answers_under_the_grammar(tiny_dir, grammar, matmul):
    thinker = TransformersBackend(
        str(tiny_dir), think=True, max_new_tokens=200, answer_tokens=160, download=False
    )
    messages = build_messages(Context(matmul, resolve_target("llvm")))
    [reply] = thinker.complete(messages, 1, grammar, seed=0)
    assert reply.reasoning and parses(reply.answer)
    assert reply.text.startswith(reply.reasoning) and "```schedlang" in reply.text


def test_a_missing_model_folder_says_how_to_get_the_weights(tmp_path):
    with pytest.raises(SchedlangError) as missing:
        TransformersBackend(str(tmp_path / "VibeThinker-1.5B"))
    assert "does not exist" in missing.value.message
    assert "--local-dir DIR" in missing.value.render()
    with pytest.raises(SchedlangError) as not_cached:
        TransformersBackend("nobody/no-such-model", download=False)
    assert "hf download nobody/no-such-model" in not_cached.value.render()


def test_an_uncached_model_without_a_hub_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SchedlangError) as offline:
        TransformersBackend("nobody/no-such-model")
    assert "the model hub cannot be reached (HF_HUB_OFFLINE is set)" in offline.value.message
    assert "--model DIR" in offline.value.render()


def test_the_cli_reports_a_missing_model_without_a_traceback(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(EXAMPLES / "matmul_4x4.py"),
            "--proposer",
            "model",
            "--model",
            str(tmp_path / "nothing-here"),
            "--db",
            str(tmp_path / "t.db"),
        ],
    )
    assert result.exit_code == 1
    assert "no model in" in result.output and "Traceback" not in result.output


# --- the HTTP backend -----------------------------------------------------------------------------


def _serve(handler) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class _Handler(JsonHandler):
    def request_json(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))


@pytest.fixture(scope="session")
def model_server(tiny_dir):
    """The tiny model behind the OpenAI chat-completions protocol, with vLLM's grammar field."""
    from schedlang.testing.tiny_model import make_server

    server = make_server(str(tiny_dir))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", server.received
    server.shutdown()


def test_the_http_backend_sends_the_grammar_and_every_answer_parses(model_server, grammar, matmul):
    url, received = model_server
    client = OpenAIBackend(url, "tiny", think=False, max_new_tokens=256, timeout_s=60)
    messages = build_messages(Context(matmul, resolve_target("llvm")))
    replies = client.complete(messages, 4, grammar, seed=3)
    assert len(replies) == 4 and all(parses(r.answer) for r in replies)
    sent = received[-1]
    assert sent["model"] == "tiny" and sent["n"] == 4 and sent["seed"] == 3
    assert sent["temperature"] == 0.6 and sent["top_p"] == 0.95 and sent["max_tokens"] == 256
    lark = sent["structured_outputs"]["grammar"]
    assert lark.startswith("%llguidance {}") and 'start: "```schedlang\\n"' in lark
    thinking = OpenAIBackend(url, "tiny", think=True).request_body(messages, 1, grammar, None)
    assert "_reasoning[lazy]" in thinking["structured_outputs"]["grammar"]


def test_the_model_proposer_works_over_http(model_server, matmul):
    url, _ = model_server
    client = OpenAIBackend(url, "tiny", think=False, max_new_tokens=256, timeout_s=60)
    proposer = ModelProposer(client, candidates_per_round=2, bounds=Bounds())
    proposals = proposer.propose(Context(matmul, resolve_target("llvm")), [], count=8)
    assert proposals and all(p.proposer == "model:tiny" for p in proposals)
    assert all(parses(p.text) for p in proposals)


def test_a_server_that_is_down_is_a_clear_error_after_retries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free, and nothing listens once closed
    client = OpenAIBackend(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.01, timeout_s=1)
    with pytest.raises(SchedlangError) as down:
        client.complete([{"role": "user", "content": "hi"}], 1)
    assert "did not answer" in down.value.message and "3 attempts" in down.value.message
    assert "vllm serve" in down.value.render()


def test_the_http_backend_retries_busy_servers_and_drops_a_refused_grammar(full_grammar):
    calls = []

    class Flaky(_Handler):
        def do_POST(self) -> None:
            body = self.request_json()
            calls.append(body)
            if len(calls) == 1:
                return self.reply(503, {"error": {"message": "warming up"}})
            if "structured_outputs" in body:
                return self.reply(400, {"error": {"message": "unknown field structured_outputs"}})
            content = "Tiles of 2x2.\n```schedlang\ntile i, j by 2x2\nunroll k\n```"
            message = {"role": "assistant", "content": content}
            self.reply(200, {"choices": [{"message": message, "finish_reason": "stop"}]})

    server, url = _serve(Flaky)
    try:
        client = OpenAIBackend(url, "m", backoff_s=0.01, timeout_s=5)
        [reply] = client.complete([{"role": "user", "content": "go"}], 1, full_grammar)
    finally:
        server.shutdown()
    assert len(calls) == 3 and "structured_outputs" not in calls[-1]
    assert reply.answer == "tile i, j by 2x2\nunroll k\n" and not reply.constrained
    assert reply.reasoning == "Tiles of 2x2.\n" and "refused the grammar" in reply.notes[0]
    assert chat_completions_url("http://h:8000") == "http://h:8000/v1/chat/completions"


# --- the repair round, scripted -------------------------------------------------------------------


class ScriptedBackend:
    """Replays canned replies in order; remembers the chats it was given."""

    name = "scripted"

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.chats: list[list[dict]] = []

    def complete(self, messages, count, grammar=None, seed=None):
        self.chats.append(list(messages))
        out = []
        for _ in range(count):
            text = self.replies.pop(0)
            out.append(Completion(text=text, answer=extract_answer(text), reasoning="r"))
        return out


@pytest.fixture(scope="session")
def matmul_4x4():
    return load_op(str(EXAMPLES / "matmul_4x4.py"))


def test_a_broken_answer_gets_one_repair_round(matmul_4x4):
    advice = "The seed's advice.\n```schedlang\ntile i, j by 2x2\nunroll k\n```"
    unknown_axis = "```schedlang\ntile i, j by 2x2\nunroll k.i\n```"
    axis_fixed = "```schedlang\ntile i, j by 2x2\nunroll i.i\n```"
    syntax_error = "```schedlang\ntile i j by 2x2\n```"
    syntax_fixed = "```schedlang\ntile i, j by 2x2\nunroll j.i\n```"
    backend = ScriptedBackend([advice, unknown_axis, syntax_error, axis_fixed, syntax_fixed])
    proposer = ModelProposer(backend, candidates_per_round=3, constrain=False)
    context = Context(matmul_4x4, resolve_target("llvm"))
    kept, repaired, reparsed = proposer.propose(context, [], count=3)

    assert kept.text == "tile i, j by 2x2\nunroll k\n" and "repair" not in kept.extra
    assert kept.extra["reply"]["text"] == advice and kept.extra["final_diagnostics"] == ""
    assert repaired.text == "tile i, j by 2x2\nunroll i.i\n" and repaired.extra["repaired"]
    assert "error: " in repaired.extra["first_diagnostics"]
    assert "`k.i`" in repaired.extra["first_diagnostics"]
    assert repaired.extra["repair"]["answer"] == "tile i, j by 2x2\nunroll i.i\n"
    assert repaired.note.endswith("(repaired)")
    assert reparsed.text == "tile i, j by 2x2\nunroll j.i\n" and reparsed.extra["repaired"]
    assert "expected" in reparsed.extra["first_diagnostics"]
    # The repair chat: the question, the broken answer alone, the diagnostics.
    question, answer, diagnostics = backend.chats[1][-3:]
    assert question == backend.chats[0][-1]
    assert answer == {"role": "assistant", "content": unknown_axis}
    assert "`k.i`" in diagnostics["content"] and "corrected schedule" in diagnostics["content"]

    backend.replies = ["```schedlang\nsplit q by 2\n```", "```schedlang\nsplit q by 4\n```"]
    [still_broken] = proposer.propose(context, [], count=1)
    assert still_broken.text == "split q by 4\n" and still_broken.extra["repaired"] is False
    assert (
        still_broken.note.endswith(": parsed") and "`q`" in still_broken.extra["final_diagnostics"]
    )


def test_a_reply_without_schedlang_is_not_proposed(matmul_4x4):
    replies = ["I would tile it.", "```schedlang\nunroll k\n```", "tile i, j by 2x2"]
    backend = ScriptedBackend(replies)
    proposer = ModelProposer(backend, candidates_per_round=3, constrain=False, want="schedule")
    proposals = proposer.propose(Context(matmul_4x4, resolve_target("llvm")), [], count=3)
    assert [p.text for p in proposals] == ["unroll k\n", "tile i, j by 2x2\n"]  # bare is fine
    assert proposer.unanswered[0].text == "I would tile it."
    assert "holding a concrete schedule, without `param`" in backend.chats[0][-1]["content"]


# --- the whole loop -------------------------------------------------------------------------------


def test_tuning_with_the_tiny_model_end_to_end(tmp_path, backend, matmul):
    chats = []

    class Recording:
        name = backend.name

        def complete(self, messages, count, grammar=None, seed=None):
            chats.append(messages)
            return backend.complete(messages, count, grammar, seed)

    proposer = ModelProposer(Recording(), candidates_per_round=2, bounds=Bounds(), seed=1)
    advice = Proposal("tile i, j by 2x2\nunroll k\n", "human", "the seed's advice")
    settings = Settings(trials=5, batch=2, builders=1, repeat=1, min_repeat_ms=1)
    with Database(tmp_path / "t.db") as db:
        result = tune(
            matmul,
            resolve_target("llvm"),
            db,
            settings=settings,
            templates=[advice],
            proposer=proposer,
        )
    assert len(result.records) == settings.trials and result.best is not None
    # The advice is measured; a random model's answer (an empty schedule, say) may beat it.
    measured = [r for r in result.records if r.is_ok]
    assert advice.text in [r.schedule for r in measured]
    assert result.best.gflops == max(r.gflops for r in measured) > 0
    from_model = [r for r in result.records if r.proposer == f"model:{backend.name}"]
    assert len(from_model) >= 3 and proposer.rounds >= 2
    for record in from_model:
        # An empty answer is a schedule too (the random model writes one now and then).
        assert record.extra["reply"]["constrained"] and "schedule_text" in record.extra
        assert parses(record.schedule)
        assert (
            record.is_ok or record.status is not Status.CHECK_ERROR or record.extra["diagnostics"]
        )
    # Each round after the first shows the model what was measured, and why candidates failed.
    # Repair chats are longer; edit chats ask to improve a measured schedule.
    rounds = [c for c in chats if len(c) == 2 and "Improve this" not in c[-1]["content"]]
    edits = [chat for chat in chats if len(chat) == 2 and "Improve this" in chat[-1]["content"]]
    assert len(rounds) == proposer.rounds and edits
    second = rounds[1][-1]["content"]  # after the first batch: the advice and one answer
    assert "GFLOP/s" in second and "tile i, j by 2x2" in second
    if from_model[0].status is Status.CHECK_ERROR:
        assert "check_error: " in second and ": error: " in second
