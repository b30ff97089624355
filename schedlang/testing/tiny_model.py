"""A tiny random-weight Qwen2 and a tokenizer trained here: a stand-in for a real model, built
offline in about a second, for tests and for trying the model loop on a machine without weights.

    python -m schedlang.testing.tiny_model DIR        # writes config, weights and tokenizer
    schedlang tune examples/matmul.py --proposer model --model DIR --trials 8
    python -m schedlang.testing.tiny_model serve DIR --port 8011  # the same model behind HTTP
    schedlang tune examples/matmul.py --proposer model --endpoint http://127.0.0.1:8011 \
        --model tiny --trials 8

The server speaks the part of the OpenAI chat-completions protocol schedlang uses, with vLLM's
extensions: `n`, `max_tokens`, `seed`, `stop` (left out of the reply, as vLLM does), a grammar in
`structured_outputs.grammar` (or `guided_grammar`), and `continue_final_message`. It serves one
request at a time on 127.0.0.1: a stand-in for tests and benchmarks, not a model server.

Random weights write nothing useful on their own: what they show is that every answer they are
allowed to write is a schedule the checker accepts, and how fast the loop turns. The tokenizer is
a byte-level BPE of 1,024 tokens trained on the prompts' own text and random schedlang words; the
model has the Qwen2 architecture (2 layers, hidden size 64) and a ChatML chat template.
"""

from __future__ import annotations

import json
import random
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from schedlang.lang import nodes


def _corpus(lines: int = 5000) -> list[str]:
    """schedlang-ish text: the prompts' own text, and random statements, names and numbers."""
    from schedlang.llm.grammar import schedlang_grammar
    from schedlang.llm.messages import examples, read_prompt, schedlang_reference

    rng = random.Random(0)
    prompts = [read_prompt(name) for name in ("system.md", "task.md", "repair.md")]
    prompts += [schedlang_reference(), *(example.text for example in examples())]
    # The statements in the grammar's order, as the corpus has always had them.
    words = [
        "block",
        *schedlang_grammar().statement_rules()[1:],
        "by",
        "at",
        "as",
        "in",
        "x",
        "i",
        "j",
        "k",
        "i.o",
        "j.i",
        "k.o",
    ]
    words += ["C", "A", "B", "ax0", *nodes.SCOPES, *nodes.THREAD_AXES, "```schedlang", "```"]
    text = [line + "\n" for prompt in prompts for line in prompt.splitlines()] * 20
    for _ in range(lines):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))
        text.append(line + rng.choice(["\n", "; ", ":\n  ", f" {rng.choice([2, 4, 8, 16])}\n"]))
    return text


def build_tiny_model(folder: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from schedlang.learn.pairs import train_tokenizer

    fast = train_tokenizer(_corpus(), vocab_size=1024)
    config = Qwen2Config(
        # Larger than the tokenizer, as Qwen's output layer is (151936 > 151665).
        vocab_size=len(fast) + 40,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    import torch

    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet request handler that answers JSON."""

    def log_message(self, *args) -> None:
        pass

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def make_server(folder: str, port: int = 0):
    """An HTTP server on 127.0.0.1:`port` (0: any free port) for the model in `folder`; call its
    `serve_forever()` (`server_address` says the port; `received` lists the requests' bodies)."""
    import threading
    from http.server import ThreadingHTTPServer

    from schedlang.core.diagnostics import SchedlangError
    from schedlang.llm.local import TransformersBackend

    backend = TransformersBackend(folder, think=False, download=False)
    lock = threading.Lock()

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            if not self.path.endswith("/chat/completions"):
                return self.reply(404, {"error": {"message": f"no route {self.path}"}})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            messages = body["messages"]
            if body.get("continue_final_message"):
                prompt = backend.chat_prompt(messages[:-1]) + messages[-1]["content"]
                shared = backend.chat_prompt(messages[:-1])
            else:
                prompt = shared = backend.chat_prompt(messages)
            grammar = (body.get("structured_outputs") or {}).get("grammar")
            grammar = grammar or body.get("guided_grammar")
            stop = body.get("stop") or []
            with lock:
                if body.get("seed") is not None:
                    import torch

                    torch.manual_seed(int(body["seed"]))
                try:
                    samples = self.generate(backend, prompt, grammar, body, stop, shared)
                except SchedlangError as err:  # e.g. a prompt longer than the context
                    return self.reply(400, {"error": {"message": err.message}})
            self.respond(samples, stop)

        def generate(self, backend, prompt, grammar, body, stop, shared):
            count = int(body.get("n", 1))
            samples, _ = backend.generate(
                [prompt] * count,
                [grammar] * count,
                int(body["max_tokens"]),
                stop,
                shared=shared,
            )
            return samples

        def respond(self, samples, stop) -> None:
            choices = []
            for n, sample in enumerate(samples):
                text = sample.text
                for word in stop:
                    text = text.removesuffix(word)
                message = {"role": "assistant", "content": text}
                choices.append({"index": n, "message": message, "finish_reason": sample.finish})
            usage = {"completion_tokens": sum(s.tokens for s in samples)}
            self.reply(200, {"object": "chat.completion", "choices": choices, "usage": usage})

    received: list[dict] = []  # every request's body, for tests
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.received = received  # type: ignore[attr-defined]
    return server


def serve(folder: str, port: int = 0, *, ready=None) -> None:
    """Serve the model in `folder` until interrupted; `ready(url)` is called once it listens."""
    server = make_server(folder, port)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    if ready is not None:
        ready(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m schedlang.testing.tiny_model DIR | serve DIR [--port N]"
    from schedlang.llm.local import require_llm_packages

    if args[:1] == ["serve"] and len(args) in (2, 4) and (len(args) == 2 or args[2] == "--port"):
        require_llm_packages()
        port = int(args[3]) if len(args) == 4 else 8011
        serve(args[1], port, ready=lambda url: print(f"serving {args[1]} at {url}", flush=True))
        return 0
    if len(args) != 1:
        print(usage, file=sys.stderr)
        return 2
    require_llm_packages()
    folder = Path(args[0])
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_model(folder)
    print(f"wrote a tiny random-weight Qwen2 to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
