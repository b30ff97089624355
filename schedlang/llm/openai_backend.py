"""A model behind an OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp's server,
Ollama, …): `OpenAIBackend`, over plain HTTP with the standard library.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from schedlang.core.diagnostics import SchedlangError
from schedlang.llm.backend import (
    CLOSE_FENCE,
    DEFAULT_MODEL,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    FENCE,
    GPU_MAX_NEW_TOKENS,
    Ask,
    Backend,
    Completion,
    ContextTooLong,
    Continuation,
    Sample,
    answer_after_fence,
    close_answer,
    extract_answer,
)
from schedlang.llm.grammar import DecodingGrammar

log = logging.getLogger(__name__)


class OpenAIBackend(Backend):
    """A model behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp's
    server, Ollama, …), over plain HTTP with the standard library.

    Each request is one POST to `<endpoint>/v1/chat/completions` with `model`, `messages`, `n`,
    `temperature`, `top_p`, `max_tokens` and `seed`; with a grammar, also
    `"structured_outputs": {"grammar": <Lark text>}` (`grammar_field`: vLLM ≥ 0.12 reads it with
    its llguidance backend; "guided_grammar" for older vLLM, None to send no grammar). The Lark
    text starts with `%llguidance {}`; with `think` it lets the model reason in free text up to
    the ```schedlang fence. A server that answers 400 to the grammar is asked again without it;
    servers that ignore unknown fields (llama.cpp, whose `grammar` is GBNF; Ollama) answer
    unconstrained. Either way every answer is parsed and checked by the caller.

    With `think`, the reasoning gets `max_new_tokens - answer_tokens` tokens. A reply that spends
    them all and never opens the ```schedlang fence gets a second request that continues it with
    the fence written in and the answer under the grammar (`answer_tokens` at most), as the local
    backend does.

    Continuing an assistant message (that second request, and `continue_batch`) uses the
    extension `"continue_final_message": true, "add_generation_prompt": false`, which vLLM
    (≥ 0.6.3; 0.6.4 fixed it echoing the prefix), SGLang (since March 2025, ≈ 0.4.4), TGI
    (≥ 3.0) and llama.cpp's server (the flag since May 2026; it continues a final assistant
    message by default before that) take. OpenAI's own API answers 400 to it: then
    `supports_continuation` turns False, `continue_batch` raises a SchedlangError, and
    `complete` asks afresh for only the answer instead. A server that ignores the flag silently
    starts a new turn after the prefix; that cannot be told from the reply, so such a server
    (or a chat template that rewrites the final assistant message) needs
    `supports_continuation = False` set by hand.

    Connection failures, timeouts, 429 and 5xx are retried `retries` times, waiting `backoff_s`,
    then twice that, …; then a SchedlangError says the server is down.
    """

    concurrency = 8  # requests under way at once (continue_batch, forced answers)

    def __init__(
        self,
        endpoint: str,
        model: str = DEFAULT_MODEL,
        *,
        temperature: float = DEFAULT_TEMPERATURE,
        top_p: float = DEFAULT_TOP_P,
        max_new_tokens: int | None = None,
        answer_tokens: int = 1024,
        think: bool = True,
        grammar_field: str | None = "structured_outputs",
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        api_key: str | None = None,
    ):
        super().__init__(
            model,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens or GPU_MAX_NEW_TOKENS,
            answer_tokens=answer_tokens,
            think=think,
        )
        self.url = chat_completions_url(endpoint)
        self.model = model
        # Whether the server continues an assistant message: None until a request shows it.
        self.supports_continuation: bool | None = None
        self.grammar_field = grammar_field
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.api_key = (
            api_key or os.environ.get("SCHEDLANG_API_KEY") or os.environ.get("OPENAI_API_KEY")
        )
        self.last_request: dict | None = None  # what was sent last, for audit and tests

    def request_body(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        grammar: DecodingGrammar | None,
        seed: int | None,
    ) -> dict[str, Any]:
        # With `think`, the answer's budget is kept back for a forced answer (see `complete`).
        budget = self.reasoning_tokens if self.think else 0
        budget = budget or self.max_new_tokens
        lark = grammar.lark("reasoning" if self.think else "fenced") if grammar else None
        return self._body(messages, count, budget, lark, seed)

    def _body(
        self,
        messages: Sequence[dict[str, str]],
        count: int,
        max_tokens: int,
        lark: str | None,
        seed: int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "n": count,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": max_tokens,
        }
        if seed is not None:
            body["seed"] = seed
        if lark is not None and self.grammar_field:
            if self.grammar_field == "structured_outputs":
                body["structured_outputs"] = {"grammar": lark}
            else:
                body[self.grammar_field] = lark
        return body

    def replies(self, ask: Ask) -> list[Completion]:
        messages, count, grammar, seed = ask
        body = self.request_body(messages, count, grammar, seed)
        notes = []
        started = time.perf_counter()
        try:
            reply = self._post(body)
        except _GrammarRefused as refusal:
            notes.append(f"the server refused the grammar ({refusal}): sampled unconstrained")
            log.warning("%s refused the grammar (%s): asking without it", self.url, refusal)
            body = self.request_body(messages, count, None, seed)
            reply = self._post(body)
        seconds = time.perf_counter() - started
        constrained = grammar is not None and not notes and bool(self.grammar_field)
        choices = reply.get("choices") or []
        if not choices:
            raise SchedlangError(f"the model server at {self.url} answered with no choices")
        tokens = (reply.get("usage") or {}).get("completion_tokens", 0)
        completions = []
        for choice in choices:
            message = choice.get("message") or {}
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            answer = extract_answer(content, tagged_only=constrained)
            if answer is None and reasoning:  # a reasoning parser that kept the answer
                answer = extract_answer(reasoning, tagged_only=constrained)
            closed: list[str] = []
            if answer is not None:
                answer, closed = close_answer(answer, choice.get("finish_reason") or "")
            completions.append(
                Completion(
                    text=f"{reasoning}{content}",
                    answer=answer,
                    reasoning=reasoning or content.partition(FENCE)[0],
                    constrained=constrained,
                    finish=choice.get("finish_reason") or "",
                    tokens=tokens // len(choices),
                    seconds=seconds / len(choices),
                    notes=[*notes, *closed],
                )
            )
        cut_short = [c for c in completions if c.answer is None and c.finish == "length"]
        if cut_short:
            self._force_answers(messages, cut_short, grammar if constrained else None, seed)
        return completions

    def _force_answers(
        self,
        messages: Sequence[dict[str, str]],
        replies: list[Completion],
        grammar: DecodingGrammar | None,
        seed: int | None,
    ) -> None:
        """Answers, in place, for replies that spent their budget reasoning: each reply is
        continued with the fence written for it and the answer sampled under the grammar; where
        the server cannot continue a message, the answer is asked for in a new turn."""
        notes = ["the reasoning budget ran out: the answer fence was forced"]
        if self.supports_continuation is not False:

            def rows(lark: str | None) -> list[Continuation]:
                stop = () if lark else (CLOSE_FENCE,)
                return [
                    Continuation(
                        tuple(messages), f"{r.text}\n{FENCE}", lark, self.answer_tokens, stop
                    )
                    for r in replies
                ]

            lark = grammar.lark("answer") if grammar else None
            try:
                try:
                    samples = self._continue(rows(lark), seed)
                except _GrammarRefused as refusal:
                    notes.append(f"the server refused the grammar ({refusal}): answered freely")
                    lark = None
                    samples = self._continue(rows(None), seed)
            except _ContinuationRefused as refusal:
                log.warning("%s cannot continue a message (%s)", self.url, refusal)
            else:
                for reply, sample in zip(replies, samples, strict=True):
                    reply.text = f"{reply.text}\n{FENCE}{sample.text}"
                    reply.answer, closed = answer_after_fence(sample.text, sample.finish)
                    self._answered(reply, sample, lark is not None, [*notes, *closed])
                return
        notes.append("the server cannot continue a message: the answer was asked for afresh")

        def bodies(lark: str | None) -> list[dict[str, Any]]:
            return [
                self._body(
                    [
                        *messages,
                        {"role": "assistant", "content": reply.text},
                        {"role": "user", "content": _ANSWER_NOW},
                    ],
                    1,
                    self.answer_tokens,
                    lark,
                    None if seed is None else seed + n,
                )
                for n, reply in enumerate(replies)
            ]

        lark = grammar.lark("fenced") if grammar else None
        try:
            results = self._post_each(bodies(lark))
        except _GrammarRefused as refusal:
            notes.append(f"the server refused the grammar ({refusal}): answered freely")
            lark = None
            results = self._post_each(bodies(None))
        for reply, (result, seconds) in zip(replies, results, strict=True):
            sample = self._sample(result, seconds)
            reply.text = f"{reply.text}\n{sample.text}"
            reply.answer = extract_answer(sample.text)
            self._answered(reply, sample, lark is not None, notes)

    @staticmethod
    def _answered(reply: Completion, sample: Sample, constrained: bool, notes: list[str]) -> None:
        reply.constrained = constrained
        reply.finish = sample.finish
        reply.tokens += sample.tokens
        reply.seconds += sample.seconds
        reply.notes += notes

    def continue_batch(self, rows: Sequence[Continuation], seed: int | None = None) -> list[Sample]:
        """Each row's continuation, in order: one request per row (`n: 1`, seed `seed + index`),
        `concurrency` of them at once. A row with a prefix sends it as a final assistant message
        with `"continue_final_message": true, "add_generation_prompt": false`; a row without one
        is a plain request. A server that cannot continue a message (see the class) is a
        SchedlangError, and leaves `supports_continuation` False."""
        try:
            return self._continue(rows, seed)
        except _Refused as refusal:
            raise refusal.error(self.url) from None

    def _continue(self, rows: Sequence[Continuation], seed: int | None) -> list[Sample]:
        if self.supports_continuation is False and any(row.prefix for row in rows):
            raise _ContinuationRefused("it refused `continue_final_message` before")
        bodies = []
        for index, row in enumerate(rows):
            messages = list(row.messages)
            if row.prefix:
                messages.append({"role": "assistant", "content": row.prefix})
            row_seed = None if seed is None else seed + index
            body = self._body(messages, 1, row.max_new_tokens, row.lark, row_seed)
            if row.prefix:
                body |= {"continue_final_message": True, "add_generation_prompt": False}
            if row.stop:
                body["stop"] = list(row.stop)
            bodies.append(body)
        return [self._sample(reply, seconds) for reply, seconds in self._post_each(bodies)]

    def _post_each(self, bodies: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
        """Each body posted, `concurrency` at once; the replies in order, with their seconds."""
        from concurrent.futures import ThreadPoolExecutor

        def post(body: dict[str, Any]) -> tuple[dict[str, Any], float]:
            started = time.perf_counter()
            reply = self._post(body)
            return reply, time.perf_counter() - started

        results = []
        pending = list(bodies)
        continuation_unknown = self.supports_continuation is None and len(pending) > 1
        if continuation_unknown and pending[0].get("continue_final_message"):
            results.append(post(pending.pop(0)))  # one refusal rather than a burst
        if pending:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(pending))) as pool:
                results += pool.map(post, pending)
        return results

    def _sample(self, reply: dict[str, Any], seconds: float) -> Sample:
        choices = reply.get("choices") or []
        if not choices:
            raise SchedlangError(f"the model server at {self.url} answered with no choices")
        choice = choices[0]
        message = choice.get("message") or {}
        # A reasoning parser may file a continuation under reasoning: the text is both.
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        text = f"{reasoning}{message.get('content') or ''}"
        tokens = (reply.get("usage") or {}).get("completion_tokens") or 0
        return Sample(text, int(tokens), choice.get("finish_reason") or "", seconds)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        self.last_request = body
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    reply = json.loads(response.read().decode("utf-8"))
                if body.get("continue_final_message"):
                    self.supports_continuation = True
                return reply
            except urllib.error.HTTPError as err:
                detail = _error_detail(err)
                if err.code == 429 or err.code >= 500:
                    problem = f"HTTP {err.code}: {detail}"
                    continue
                continuing = body.get("continue_final_message")
                if err.code in (400, 422) and continuing and _about_continuation(detail):
                    self.supports_continuation = False
                    raise _ContinuationRefused(f"HTTP {err.code}: {detail}") from None
                if err.code in (400, 422) and _about_context(detail):
                    raise ContextTooLong(
                        f"the model server at {self.url} refused the request: HTTP {err.code}: "
                        f"{detail}",
                        "shorten --hint, or lower --max-new-tokens",
                    ) from None
                if err.code in (400, 422) and _has_grammar(body) and _about_grammar(detail):
                    raise _GrammarRefused(f"HTTP {err.code}: {detail}") from None
                raise SchedlangError(
                    f"the model server at {self.url} refused the request: HTTP {err.code}: "
                    f"{detail}",
                    f"is `{self.model}` the name it serves? pass it with --model",
                ) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                reason = getattr(err, "reason", err)
                problem = str(reason) or type(reason).__name__
            except json.JSONDecodeError as err:
                problem = f"not JSON: {err}"
        raise SchedlangError(
            f"the model server at {self.url} did not answer: {problem} "
            f"({self.retries + 1} attempts)",
            "start it (e.g. `vllm serve WeiboAI/VibeThinker-1.5B`), or check --endpoint",
        )


def _about_context(detail: str) -> bool:
    """A server's refusal of a prompt longer than the model's context (vLLM: "This model's
    maximum context length is …"; the tiny server: "… attends to N tokens")."""
    return bool(re.search(r"context length|context window|attends to \d+ tokens", detail, re.I))


class _Refused(Exception):
    """The server refused a request: what it refused (`what`) and what to do about it (`fix`)."""

    what = fix = ""

    def error(self, url: str) -> SchedlangError:
        return SchedlangError(f"the model server at {url} {self.what}: {self}", self.fix)


class _GrammarRefused(_Refused):
    what = "refused the decoding grammar"
    fix = (
        "serve the model with vLLM (≥ 0.12 reads `structured_outputs`; older: "
        "grammar_field='guided_grammar'), or run it here with --model"
    )


class _ContinuationRefused(_Refused):
    what = "cannot continue an assistant message"
    fix = (
        "serve the model with vLLM (≥ 0.6.4) or SGLang, which take "
        "`continue_final_message`, or run it here with --model"
    )


_ANSWER_NOW = "Your reasoning budget is spent. Answer now with only the ```schedlang block."


def _about_continuation(detail: str) -> bool:
    """A refusal of the final assistant message: vLLM's and transformers' own words, OpenAI's
    unknown argument, "last message must be from the user"."""
    words = r"continue_final_message|add_generation_prompt|(final|last) message|prefill"
    return bool(re.search(words, detail, re.I))


def _has_grammar(body: dict[str, Any]) -> bool:
    return "structured_outputs" in body or "guided_grammar" in body


def _about_grammar(detail: str) -> bool:
    return bool(re.search(r"grammar|structured|guided|guidance|lark", detail, re.I))


def _error_detail(err: urllib.error.HTTPError) -> str:
    try:
        text = err.read().decode("utf-8", "replace")
    except Exception:  # the body is optional
        text = ""
    try:
        message = json.loads(text).get("error", text)
        if isinstance(message, dict):
            message = message.get("message", text)
        text = str(message)
    except (json.JSONDecodeError, AttributeError):
        pass
    return " ".join(text.split())[:300] or err.reason


def chat_completions_url(endpoint: str) -> str:
    """`http://host:8000`, `…/v1` or the full `…/v1/chat/completions`: the full URL."""
    url = endpoint.rstrip("/")
    if not re.match(r"https?://", url):
        raise SchedlangError(
            f"--endpoint {endpoint!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000/v1"
        )
    if url.endswith("/chat/completions"):
        return url
    return f"{url}/chat/completions" if url.endswith("/v1") else f"{url}/v1/chat/completions"
