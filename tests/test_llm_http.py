"""The HTTP backend continuing an assistant message: `continue_batch` (one request per row,
vLLM's `continue_final_message`), servers that cannot continue one, and the answer fence forced
over HTTP when a reasoning model spends its whole budget reasoning.

The server is a loopback HTTP server in front of the tiny offline model
(schedlang.testing.tiny_model); it
continues a final assistant message as vLLM does, by leaving the assistant's turn open:
the chat prompt of the messages before it, then its text.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
llguidance = pytest.importorskip("llguidance")

from schedlang.core.diagnostics import SchedlangError  # noqa: E402
from schedlang.core.ops import load_op  # noqa: E402
from schedlang.lang.syntax import parse  # noqa: E402
from schedlang.llm.backend import Continuation  # noqa: E402
from schedlang.llm.grammar import Bounds, OpNames, decoding_grammar  # noqa: E402
from schedlang.llm.local import TransformersBackend  # noqa: E402
from schedlang.llm.openai_backend import OpenAIBackend  # noqa: E402
from schedlang.testing.tiny_model import JsonHandler, build_tiny_model  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CHAT = ({"role": "user", "content": "Schedule the matmul C = A @ B."},)
FORCED = "the reasoning budget ran out: the answer fence was forced"
ANSWER_NOW = "Your reasoning budget is spent. Answer now with only the ```schedlang block."


@pytest.fixture(scope="session")
def tiny_backend(tmp_path_factory) -> TransformersBackend:
    torch.set_num_threads(1)  # a tiny model runs several times faster on one thread
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-http"))
    return TransformersBackend(str(folder), think=False, max_new_tokens=256, download=False)


@dataclass
class Server:
    """What the fake server was sent, and how it behaves: `canned` replies (popped in order)
    answer plain requests in place of the model; `refusal` refuses continuations with it."""

    url: str
    received: list[dict] = field(default_factory=list)
    canned: list[list[tuple[str, str]]] = field(default_factory=list)
    refusal: str | None = None
    in_flight: int = 0
    most_in_flight: int = 0


def _completion(choices: list[tuple[str, str]], tokens: int) -> dict:
    return {
        "object": "chat.completion",
        "choices": [
            {"index": n, "message": {"role": "assistant", "content": text}, "finish_reason": why}
            for n, (text, why) in enumerate(choices)
        ],
        "usage": {"completion_tokens": tokens},
    }


@pytest.fixture(scope="session")
def http_server(tiny_backend):
    """The tiny model behind /v1/chat/completions, with vLLM's grammar and continuation fields."""
    model_lock = threading.Lock()
    count_lock = threading.Lock()

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            server.received.append(body)
            with count_lock:
                server.in_flight += 1
                server.most_in_flight = max(server.most_in_flight, server.in_flight)
            try:
                self.answer(body)
            finally:
                with count_lock:
                    server.in_flight -= 1

        def answer(self, body: dict) -> None:
            messages = body["messages"]
            if body.get("continue_final_message"):
                if server.refusal:
                    return self.reply(400, {"error": {"message": server.refusal}})
                if body.get("add_generation_prompt", True):
                    message = "Cannot set both `continue_final_message` and `add_generation_prompt`"
                    return self.reply(400, {"error": {"message": message}})
                assert messages[-1]["role"] == "assistant"
                prompt = tiny_backend.chat_prompt(messages[:-1]) + messages[-1]["content"]
            elif server.canned:
                choices = server.canned.pop(0)
                return self.reply(200, _completion(choices, 7 * len(choices)))
            else:
                prompt = tiny_backend.chat_prompt(messages)
            count = body.get("n", 1)
            lark = (body.get("structured_outputs") or {}).get("grammar") or body.get(
                "guided_grammar"
            )
            stop = body.get("stop") or []
            with model_lock:  # one generation at a time, as one GPU would
                if body.get("seed") is not None:
                    torch.manual_seed(body["seed"])
                samples, _ = tiny_backend.generate(
                    [prompt] * count, [lark] * count, body["max_tokens"], stop
                )
            choices = []
            for sample in samples:
                text = sample.text
                for word in stop:  # vLLM leaves the stop string out
                    text = text.removesuffix(word)
                choices.append((text, sample.finish))
            self.reply(200, _completion(choices, sum(s.tokens for s in samples)))

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server = Server(f"http://127.0.0.1:{http.server_address[1]}/v1")
    threading.Thread(target=http.serve_forever, daemon=True).start()
    yield server
    http.shutdown()


@pytest.fixture
def server(http_server) -> Server:
    http_server.received.clear()
    http_server.canned.clear()
    http_server.refusal = None
    http_server.most_in_flight = 0
    return http_server


@pytest.fixture(scope="session")
def matmul_grammar():
    matmul = load_op(str(EXAMPLES / "matmul.py"), {"M": "32", "N": "32", "K": "32"})
    return decoding_grammar(OpNames.of(matmul), Bounds())


def parses(text: str | None) -> bool:
    try:
        parse(text or "")
    except SchedlangError:
        return False
    return text is not None


SPLIT = '%llguidance {}\nstart: "split i by " ("2"|"4") "\\n"\n'
UNROLL = '%llguidance {}\nstart: "unroll " ("i"|"j"|"k") "\\n"\n'


# --- continue_batch -------------------------------------------------------------------------------


def test_continue_batch_continues_each_row_in_order_under_its_grammar(server):
    client = OpenAIBackend(server.url, "tiny", timeout_s=60)
    rows = [
        Continuation(CHAT, "```schedlang\n", SPLIT, 16),
        Continuation(CHAT, "```schedlang\nsplit i by 4\n", UNROLL, 16),
        Continuation(CHAT, "```schedlang\n", UNROLL, 16),
        Continuation(CHAT, "```schedlang\nunroll k\n", SPLIT, 16),
        Continuation(CHAT, "```schedlang\n", None, 8, stop=("\n",)),
    ]
    samples = client.continue_batch(rows, seed=5)
    assert len(samples) == len(rows)
    for row, sample in zip(rows[:4], samples, strict=False):
        expected = r"split i by [24]\n" if row.lark == SPLIT else r"unroll [ijk]\n"
        assert re.fullmatch(expected, sample.text), (row.prefix, sample.text)
        assert sample.finish == "stop" and sample.tokens > 0 and sample.seconds > 0
    assert "\n" not in samples[4].text and samples[4].tokens <= 8
    assert client.supports_continuation is True

    sent = sorted(server.received, key=lambda body: body["seed"])
    assert [body["seed"] for body in sent] == [5, 6, 7, 8, 9]
    for row, body in zip(rows, sent, strict=True):
        assert body["messages"] == [*CHAT, {"role": "assistant", "content": row.prefix}]
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
        assert body["n"] == 1 and body["max_tokens"] == row.max_new_tokens
        if row.lark:
            assert body["structured_outputs"] == {"grammar": row.lark} and "stop" not in body
        else:
            assert "structured_outputs" not in body and body["stop"] == ["\n"]
    assert server.most_in_flight >= 2  # sent side by side, not one after another


def test_a_row_without_a_prefix_is_a_plain_request(server):
    client = OpenAIBackend(server.url, "tiny", timeout_s=60, grammar_field="guided_grammar")
    [sample] = client.continue_batch([Continuation(CHAT, "", UNROLL, 16)])
    assert re.fullmatch(r"unroll [ijk]\n", sample.text)
    [body] = server.received
    assert body["messages"] == list(CHAT) and body["guided_grammar"] == UNROLL
    assert "continue_final_message" not in body and "seed" not in body
    assert client.supports_continuation is None  # nothing learned


def test_a_server_that_cannot_continue_a_message_is_a_clear_error(server):
    server.refusal = "Unrecognized request argument supplied: continue_final_message"
    client = OpenAIBackend(server.url, "tiny", timeout_s=60)
    rows = [Continuation(CHAT, "```schedlang\n", SPLIT, 16)] * 3
    with pytest.raises(SchedlangError) as refused:
        client.continue_batch(rows, seed=0)
    assert "cannot continue an assistant message" in refused.value.message
    assert "continue_final_message" in refused.value.message
    assert "vLLM" in refused.value.render()
    assert client.supports_continuation is False
    assert len(server.received) == 1  # one refused request, not one per row
    with pytest.raises(SchedlangError, match="cannot continue"):
        client.continue_batch(rows)
    assert len(server.received) == 1  # known now: nothing sent


# --- the answer fence, forced over HTTP -----------------------------------------------------------


def test_a_reply_that_reasoned_to_the_end_of_its_budget_gets_its_fence_forced(
    server, matmul_grammar
):
    answered = "Tiles of 2x2.\n```schedlang\ntile i, j by 2x2\n```"
    reasoning = "Let me think about tiling i and j, then unrolling k, and then"
    server.canned.append([(answered, "stop"), (reasoning, "length")])
    client = OpenAIBackend(
        server.url, "tiny", think=True, max_new_tokens=400, answer_tokens=160, timeout_s=60
    )
    kept, forced = client.complete(list(CHAT), 2, matmul_grammar, seed=0)

    first, continued = server.received
    assert first["max_tokens"] == 400 - 160 and first["n"] == 2
    assert "_reasoning[lazy]" in first["structured_outputs"]["grammar"]
    assert continued["continue_final_message"] is True and continued["max_tokens"] == 160
    assert continued["messages"][-1] == {
        "role": "assistant",
        "content": f"{reasoning}\n```schedlang",
    }
    assert continued["structured_outputs"]["grammar"] == matmul_grammar.lark("answer")

    assert kept.answer == "tile i, j by 2x2\n" and kept.notes == []
    assert parses(forced.answer), forced.text
    assert forced.notes == [FORCED] and forced.constrained and forced.finish == "stop"
    assert forced.reasoning == reasoning and forced.text.startswith(f"{reasoning}\n```schedlang\n")
    assert forced.tokens > 7


def test_without_continuation_the_answer_is_asked_for_in_a_new_turn(server, matmul_grammar):
    reasoning = "Tiling first. Then unrolling. Then"
    server.canned += [
        [(reasoning, "length")],
        [("```schedlang\nblock C:\n  tile i, j by 4x4\n```", "stop")],
    ]
    server.refusal = "continue_final_message is set but the final message does not appear"
    client = OpenAIBackend(
        server.url, "tiny", think=True, max_new_tokens=300, answer_tokens=100, timeout_s=60
    )
    [reply] = client.complete(list(CHAT), 1, matmul_grammar, seed=4)

    first, refused, fresh = server.received
    assert first["max_tokens"] == 200 and refused["continue_final_message"] is True
    assert client.supports_continuation is False
    assert "continue_final_message" not in fresh and fresh["max_tokens"] == 100
    assert fresh["messages"][-2:] == [
        {"role": "assistant", "content": reasoning},
        {"role": "user", "content": ANSWER_NOW},
    ]
    assert fresh["structured_outputs"]["grammar"] == matmul_grammar.lark("fenced")
    assert fresh["seed"] == 4
    assert reply.answer == "block C:\n  tile i, j by 4x4\n" and parses(reply.answer)
    assert reply.notes[0] == FORCED and "asked for afresh" in reply.notes[1]
    assert reply.tokens == 14 and reply.constrained


def test_without_think_the_whole_budget_goes_to_the_reply(server, matmul_grammar):
    client = OpenAIBackend(server.url, "tiny", think=False, max_new_tokens=256)
    body = client.request_body(list(CHAT), 1, matmul_grammar, None)
    assert body["max_tokens"] == 256
    thinker = OpenAIBackend(server.url, "tiny", max_new_tokens=512, answer_tokens=1024)
    assert thinker.request_body(list(CHAT), 1, None, None)["max_tokens"] == 512


# --- the model proposer over HTTP, a statement at a time -----------------------------------------


def test_per_statement_decoding_over_http_writes_answers_that_check_clean(server):
    from schedlang.checker.check import check
    from schedlang.core.target import resolve_target
    from schedlang.llm.proposer import ModelProposer
    from schedlang.propose.interface import Context

    op = load_op(str(EXAMPLES / "softmax.py"), {"rows": "64", "cols": "64"})
    target = resolve_target("llvm")
    backend = OpenAIBackend(server.url, "tiny", max_new_tokens=96, answer_tokens=64, backoff_s=0)
    proposer = ModelProposer(backend, candidates_per_round=3, seed=4)
    proposals = proposer.propose(Context(op, target), [], count=3)
    assert proposals and all(check(parse(p.text), op.func, target).ok for p in proposals)
    steps = [body for body in server.received if body.get("continue_final_message")]
    reasoning = [body for body in server.received if not body.get("continue_final_message")]
    # The reasoning: one plain request per answer, stopped at the fence, within its budget.
    assert len(reasoning) == 3 and all(b["stop"] == ["```schedlang"] for b in reasoning)
    assert all(b["max_tokens"] == 96 - 64 for b in reasoning)
    # Then every statement: the assistant's message continued under a step's grammar.
    assert steps and all(b["messages"][-1]["role"] == "assistant" for b in steps)
    assert all(b["structured_outputs"]["grammar"].startswith("%llguidance") for b in steps)
    assert all("```schedlang\n" in b["messages"][-1]["content"] for b in steps)
    for proposal in proposals:
        assert proposal.extra["grammar"]["decoding"] == "stepwise"
        assert proposal.extra["reply"]["constrained"]
