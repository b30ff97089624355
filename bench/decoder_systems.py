"""One system of bench/bench_decoder.py timed in this process (the benchmark starts one process
per system and round, so that each one's peak memory is its own):

    python bench/decoder_systems.py SYSTEM SPEC.json RESULT.json

SYSTEM is one of `SYSTEMS`; SPEC.json says where the model's files are and what to measure
(`bench_decoder.child_spec` writes it); RESULT.json gets the figures. Every system runs on
`threads` threads, from the same prompt token ids (numpy's generator with `seed`), and is measured
the same way:

    load      the model read and made ready (torch.compile: its first calls are `warmup_s`)
    warm-up   one short prefill and two decode steps, untimed (torch.compile: every measurement
              once, since each new shape compiles: its compile time)
    prefill   a fresh cache, the first P prompt ids in: seconds to the last token's logits
    decode    a fresh cache, the first C ids prefilled, then `steps` greedy steps: their seconds,
              and the greedy tokens (the prefill's and each step's)
    peak RSS  the process's own peak resident memory at the end: /proc/self/status's VmHWM
              (getrusage's ru_maxrss would do, but Linux carries it over from the parent across
              fork and exec: every child would report at least the benchmark's own peak)
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

import numpy as np

SYSTEMS = ("schedlang", "eager", "compile", "ortgenai", "llamacpp")


def prompt_ids(spec: dict) -> list[int]:
    """The prompt every system reads: `max(prefill, contexts)` ids below the vocabulary size."""
    longest = max([*spec["prefill"], *spec["contexts"]])
    rng = np.random.default_rng(spec["seed"])
    return rng.integers(0, spec["vocab_size"], longest).tolist()


class Runner:
    """A system: `load` once, then `prefill` (a fresh cache) and `generate` (a fresh cache,
    greedy: the tokens and the seconds of the decode steps)."""

    full_warmup = False

    def __init__(self, spec: dict) -> None:
        self.spec = spec

    def load(self) -> None:
        raise NotImplementedError

    def prefill(self, ids: list[int]) -> None:
        raise NotImplementedError

    def generate(self, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        return {}


class SchedlangRunner(Runner):
    """schedlang.models.decoder.load with the database's schedules (as `generate --db` builds)."""

    def load(self) -> None:
        from contextlib import ExitStack

        from schedlang.core.target import resolve_target
        from schedlang.models import decoder

        target = resolve_target(self.spec.get("target", "llvm"))
        with ExitStack() as stack:
            schedule = None
            if self.spec.get("db"):
                from schedlang.models.graph import ApplySchedlangDatabase
                from schedlang.workflows.database import database

                opened = stack.enter_context(database(self.spec["db"], read_only=True))
                schedule = ApplySchedlangDatabase(opened, target)
            self.model = decoder.load(
                self.spec["checkpoint"], self.spec["max_length"], target, schedule
            )
        applied = list(schedule.applied) if schedule is not None else []
        self.scheduled = sum(item.how == "schedlang" for item in applied), len(applied)

    def prefill(self, ids: list[int]) -> None:
        self.model.reset()
        self.model.prefill(ids)

    def generate(self, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
        result = self.model.generate(ids, new_tokens)
        return list(result.tokens), result.decode_s

    def versions(self) -> dict[str, str]:
        import tvm

        from schedlang import __version__

        versions = {"schedlang": __version__, "tvm": tvm.__version__}
        if not self.spec.get("db"):
            return {**versions, "db": "none (kernels unscheduled)"}
        scheduled = "{} of {} kernels from it".format(*self.scheduled)
        return {**versions, "db": f"{self.spec['db']} ({scheduled})"}


class _Streamer:
    """transformers' streamer interface: the time each `put` comes (the prompt, then a token)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())
        if len(self.times) > 1:
            self.tokens.extend(int(t) for t in value.reshape(-1).tolist())

    def end(self) -> None:
        pass


class TorchRunner(Runner):
    """transformers' model: `generate` with its own (dynamic) cache; prefill one forward with
    `logits_to_keep=1` (the last token's logits only, as the other systems compute)."""

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(self.spec["threads"])
        self.torch = torch
        model = AutoModelForCausalLM.from_pretrained(
            self.spec["checkpoint"], dtype=torch.float32, local_files_only=True
        )
        model.eval()
        model.generation_config.eos_token_id = None  # random weights: always `new_tokens`
        model.generation_config.pad_token_id = 0
        self.model = model

    def prefill(self, ids: list[int]) -> None:
        with self.torch.inference_mode():
            self.model(input_ids=self.torch.tensor([ids]), logits_to_keep=1)

    def generate(self, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
        streamer = _Streamer()
        tensor = self.torch.tensor([ids])
        with self.torch.inference_mode():
            self.model.generate(
                tensor, attention_mask=self.torch.ones_like(tensor), do_sample=False,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=streamer,
            )  # fmt: skip
        # puts: the prompt, the prefill's token, then one per decode step
        return streamer.tokens, streamer.times[-1] - streamer.times[1]

    def versions(self) -> dict[str, str]:
        import transformers

        return {"torch": self.torch.__version__, "transformers": transformers.__version__}


class CompiledRunner(TorchRunner):
    """TorchRunner with `model.forward = torch.compile(model.forward)` (default mode)."""

    full_warmup = True

    def load(self) -> None:
        super().load()
        self.model.forward = self.torch.compile(self.model.forward)


class GenaiRunner(Runner):
    """onnxruntime-genai on the model its builder wrote (fp32, cpu), `threads` intra-op
    threads (genai_config.json's session options, set when the folder was prepared)."""

    def load(self) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(self.spec["genai_dir"])

    def _generator(self, total: int) -> Any:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=total)
        return self.og.Generator(self.model, params)

    def prefill(self, ids: list[int]) -> None:
        generator = self._generator(len(ids) + 1)
        generator.append_tokens(np.asarray([ids], dtype=np.int32))
        generator.get_logits()

    def generate(self, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
        generator = self._generator(len(ids) + new_tokens)
        generator.append_tokens(np.asarray([ids], dtype=np.int32))  # the prompt's logits
        tokens = [int(np.argmax(generator.get_logits()[0, -1]))]
        start = time.perf_counter()
        while len(tokens) < new_tokens:
            # the token is chosen from the logits at hand, then the model runs on it
            generator.append_tokens(np.asarray([[tokens[-1]]], dtype=np.int32))
            tokens.append(int(np.argmax(generator.get_logits()[0, -1])))
        return tokens, time.perf_counter() - start

    def versions(self) -> dict[str, str]:
        import onnxruntime

        return {"onnxruntime-genai": self.og.__version__, "onnxruntime": onnxruntime.__version__}


class LlamaCppRunner(Runner):
    """llama-cpp-python on the F32 GGUF: `Llama.eval` (batches of `n_batch` = the cache's
    length, llama.cpp's micro-batch of 512), the last token's logits from `llama_get_logits_ith`;
    flash attention as llama-cpp-python's default (off) unless the spec says `flash_attn`."""

    def load(self) -> None:
        import llama_cpp

        self.llama_cpp = llama_cpp
        threads = self.spec["threads"]
        self.llm = llama_cpp.Llama(
            model_path=self.spec["gguf"], n_ctx=self.spec["max_length"],
            n_batch=self.spec["max_length"], n_threads=threads, n_threads_batch=threads,
            logits_all=False, verbose=False, flash_attn=self.spec.get("flash_attn", False),
        )  # fmt: skip
        self.vocab = self.llm.n_vocab()

    def _logits(self) -> np.ndarray:
        pointer = self.llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(pointer, shape=(self.vocab,))

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)
        self._logits()

    def generate(self, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
        self.llm.reset()
        self.llm.eval(ids)
        tokens = [int(np.argmax(self._logits()))]
        start = time.perf_counter()
        while len(tokens) < new_tokens:
            self.llm.eval([tokens[-1]])
            tokens.append(int(np.argmax(self._logits())))
        return tokens, time.perf_counter() - start

    def versions(self) -> dict[str, str]:
        attention = "flash attention" if self.spec.get("flash_attn") else "no flash attention"
        return {"llama-cpp-python": f"{self.llama_cpp.__version__} ({attention})"}


RUNNERS: dict[str, type[Runner]] = {
    "schedlang": SchedlangRunner,
    "eager": TorchRunner,
    "compile": CompiledRunner,
    "ortgenai": GenaiRunner,
    "llamacpp": LlamaCppRunner,
}


def measure(runner: Runner, spec: dict) -> dict:
    """Every figure of one system, as the module's docstring says."""
    ids = prompt_ids(spec)
    steps = spec["steps"]
    start = time.perf_counter()
    runner.load()
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    if runner.full_warmup:
        for length in spec["prefill"]:
            runner.prefill(ids[:length])
        for context in spec["contexts"]:
            runner.generate(ids[:context], steps + 1)
    else:
        runner.prefill(ids[: min(8, len(ids))])
        runner.generate(ids[: min(8, len(ids))], 3)
    warmup_s = time.perf_counter() - start
    prefill_s = {}
    for length in spec["prefill"]:
        start = time.perf_counter()
        runner.prefill(ids[:length])
        prefill_s[str(length)] = time.perf_counter() - start
    decode_s, tokens = {}, {}
    for context in spec["contexts"]:
        new, seconds = runner.generate(ids[:context], steps + 1)
        if len(new) != steps + 1:
            raise RuntimeError(f"{len(new)} tokens generated at context {context}, not {steps + 1}")
        decode_s[str(context)], tokens[str(context)] = seconds, new
    return {
        "load_s": load_s, "warmup_s": warmup_s, "prefill_s": prefill_s, "decode_s": decode_s,
        "steps": steps, "tokens": tokens, "versions": runner.versions(),
        "peak_rss_bytes": peak_rss_bytes(),
    }  # fmt: skip


def peak_rss_bytes() -> int:
    """This process's peak resident memory since its exec (VmHWM), or getrusage's without /proc."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str]) -> int:
    system, spec_path, result_path = argv
    if system not in RUNNERS:
        print(f"error: unknown system {system!r} (one of {', '.join(SYSTEMS)})", file=sys.stderr)
        return 2
    with open(spec_path) as file:
        spec = json.load(file)
    os.environ.setdefault("TVM_NUM_THREADS", str(spec["threads"]))
    result = measure(RUNNERS[system](spec), spec)
    with open(result_path, "w") as out:
        json.dump(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
