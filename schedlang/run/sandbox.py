"""Worker processes that build and run candidates, so a crashing kernel never takes the tuner down.

A `Worker` is a spawned process that imports TVM once and then serves jobs over a pipe. If a job
segfaults, aborts or hangs past its timeout, the parent kills the process, reports the job as
crashed or timed out, and starts a fresh worker for the next job. The parent process never runs a
kernel itself: TVM's runtime thread pool does not survive a fork, and a kernel may do anything.

Jobs (functions in this module, looked up by name in the worker):
  build(func_json, target_json, out_path[, cc])       → export a shared library (cc: cross compiler)
  measure(measurement: MeasureJob)                    → verify against the reference, then time:
                                                        an `Outcome` (out-of-bounds writes:
                                                        GuardedArray; a slow kernel gets fewer
                                                        repeats)
  run(**MeasureJob's fields)                          → `measure`'s outcome as a plain dict
                                                        {"ok", "reason", "latencies_s"}, for
                                                        callers outside the package (fuzz/)
  reference(func_json, args_path, out_path, outputs)  → outputs of the unscheduled build
A worker's owner may add jobs of its own, named "module:function" (`Worker.jobs`): the RPC
runner's `rpc_run` is schedlang.run.remote's. This module imports nothing above it.

`verify_then_time` is the one "verify, then time" of a loaded kernel, on this machine (`measure`)
or on a device leased over RPC (schedlang.run.remote.run_on_device).
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from schedlang.core.diagnostics import error_line
from schedlang.run.outcome import Outcome, compare_outputs
from schedlang.store.records import Status

_ENVIRONMENT_SWAP = threading.Lock()
STARTUP_TIMEOUT_S = 300.0  # importing TVM in a fresh process takes seconds on a busy machine


class WorkerCrash(Exception):
    """The worker process died while running a job (segfault, abort, out of memory…)."""


class WorkerTimeout(Exception):
    """A job ran longer than its timeout; the worker was killed."""


class JobError(Exception):
    """The job raised an ordinary exception (e.g. TVM could not build); the worker lives on."""


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "the worker vanished"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in this process's environment while the block runs, so that the processes it
    starts inherit them; the old values back after. One swap at a time (a lock): two threads
    swapping at once would restore each other's values and leave them here."""
    with _ENVIRONMENT_SWAP:
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """A spawned process re-imports the parent's `__main__` script before it runs anything, so a
    user's script that calls `schedlang.build` without an `if __name__ == "__main__":` guard ran
    again inside each worker (which then failed to start). A worker needs only schedlang: spawn
    it without the script. Callers swap the environment (`environment`), so one patch at a time."""
    from multiprocessing import spawn

    real = spawn.get_preparation_data

    def without_main(name: str) -> dict[str, Any]:
        data = real(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        spawn.get_preparation_data = real


@dataclass
class Worker:
    """One spawned process serving jobs; restarted after a crash or a timeout."""

    name: str
    env: Mapping[str, str]
    jobs: Mapping[str, str] = field(default_factory=dict)  # more jobs: name → "module:function"
    process: BaseProcess | None = None  # a spawn context's process
    conn: Connection | None = None
    ready: bool = False

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Spawn the process and wait until it has imported TVM, so that start-up time is never
        counted against a job's timeout."""
        self.spawn()
        self.wait_ready(timeout_s)

    def spawn(self) -> None:
        """Start the process without waiting for it (`wait_ready` waits; `call` does too)."""
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self.process = process = context.Process(
            target=_serve,
            args=(child, dict(self.env), dict(self.jobs)),
            name=f"schedlang-{self.name}",
            daemon=True,
        )
        # The environment must be there when the process starts (glibc reads MALLOC_* then). The
        # tuner starts workers from several threads: one swap of this process's environment at a
        # time, or two would restore each other's values and leave them here.
        with environment(self.env), _without_main():
            process.start()
        child.close()
        self.conn = parent
        self.ready = False

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        assert self.process is not None and self.conn is not None
        try:
            ready = self.conn.poll(timeout_s) and self.conn.recv() == ("ready", None)
        except (EOFError, OSError):
            ready = False
        if not ready:
            exit_text = _describe_exit(self.process.exitcode)
            self.kill()
            raise WorkerCrash(f"the {self.name} worker did not start ({exit_text})")
        self.ready = True

    def call(self, job: str, timeout_s: float, **kwargs: Any) -> Any:
        if self.process is None or not self.process.is_alive():
            self.start()
        elif not self.ready:
            self.wait_ready()
        assert self.conn is not None and self.process is not None
        try:
            self.conn.send((job, kwargs))
            ready = self.conn.poll(timeout_s)
        except (BrokenPipeError, EOFError, OSError):
            ready = True  # the process died; recv below says how
        if not ready:
            self.kill()
            raise WorkerTimeout(f"{job} took more than {timeout_s:g} s")
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError, ConnectionResetError):
            self.process.join(5)
            exit_text = _describe_exit(self.process.exitcode)
            self.kill()
            raise WorkerCrash(f"{job} crashed the worker ({exit_text})") from None
        if status == "error":
            raise JobError(payload)
        return payload

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn = None, None

    def close(self) -> None:
        if self.process is not None and self.process.is_alive() and self.conn is not None:
            try:
                self.conn.send(None)
                self.process.join(2)
            except (BrokenPipeError, OSError):
                pass
        self.kill()


def _serve(conn: Connection, env: dict[str, str], more_jobs: dict[str, str]) -> None:
    os.environ.update(env)
    log_path = env.get("SCHEDLANG_WORKER_LOG")
    if log_path:  # what a crashing kernel prints (TVM's backtrace) goes here, not to the terminal
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    # The parent handles Ctrl-C; a worker must not die half-way through writing a reply.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    jobs: dict[str, Callable[..., Any]] = {
        "build": build_job,
        "measure": measure_job,
        "run": run_job,
        "reference": reference_job,
        "ping": ping_job,
    }
    # tvm_ffi imports torch whenever it is installed (the llm extra): half a worker's start-up,
    # and no job of ours needs it (an op file that imports torch lifts it: core.imports).
    from schedlang.core.imports import defer_torch

    defer_torch()
    import tvm  # noqa: F401  (the slow import happens before the parent starts a job's clock)

    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        job, kwargs = message
        try:
            if job not in jobs:  # imported on first use: the owner's module, not this one
                module, _, function = more_jobs[job].partition(":")
                jobs[job] = getattr(import_module(module), function)
            conn.send(("ok", jobs[job](**kwargs)))
        except Exception as exc:  # reported to the parent as the job's failure
            reason = error_line(exc, with_type=True)
            if os.environ.get("SCHEDLANG_TRACEBACK"):
                reason += "\n" + traceback.format_exc()
            conn.send(("error", reason))


# --- jobs (run inside the worker) ---------------------------------------------------------------


def ping_job() -> int:
    return os.getpid()


def build_job(func_json: str, target_json: str, out_path: str, cc: str | None = None) -> str:
    import tvm

    func = tvm.ir.load_json(func_json)
    target = tvm.target.Target(json.loads(target_json))
    # A function, or a module of several (a prepacked kernel: schedlang.run.packing).
    mod = func if isinstance(func, tvm.IRModule) else tvm.IRModule({"main": func})
    executable = tvm.compile(mod, target=target)
    if cc is None:
        executable.export_library(out_path)
    else:  # linked for another machine
        from tvm.support import cc as compilers

        triple = compilers.get_target_by_dump_machine(cc)
        executable.export_library(
            out_path, fcompile=compilers.cross_compiler(cc, get_target_triple=triple)
        )
    return out_path


def reference_job(func_json: str, args_path: str, out_path: str, outputs: list[int]) -> str:
    """Outputs of the unscheduled function, built for the host CPU."""
    import numpy as np
    import tvm

    func = tvm.ir.load_json(func_json)
    executable = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target("llvm"))
    args = load_arrays(args_path)
    tensors = [tvm.runtime.tensor(a, tvm.cpu(0)) for a in args]
    executable(*tensors)
    np.savez(out_path, *[tensors[i].numpy() for i in outputs])
    return out_path


@dataclass(frozen=True)
class MeasureJob:
    """One built kernel to verify, then time: what the `measure` job runs in a worker on this
    machine, and `rpc_run` on a device leased over RPC (schedlang.run.remote)."""

    lib_path: str  # the exported library
    args_path: str  # its arguments: an .npz file (np.savez), one array per parameter, in order
    expected_path: str  # the outputs it must give: an .npz file, in the order of `outputs`
    outputs: list[int]  # positions of the outputs among the parameters
    device: str  # "cpu", or a GPU kind ("cuda")
    repeat: int  # timing runs; 0: verify only
    min_repeat_ms: int
    # This machine only: a first run slower than this gets fewer repeats (`slow_timing`), and the
    # outputs in `poison` (those nothing reads) are filled with NaN before it.
    slow_run_s: float | None = None
    poison: list[int] | None = None
    names: list[str] | None = None  # the outputs' names in messages; else "output N"
    # A library of a `prepack`ed kernel (schedlang.run.packing): (parameter, packed shape, dtype)
    # of each weight its packing makes; `main` is verified, the kernel timed on packed weights.
    prepacked: list[tuple[int, tuple[int, ...], str]] | None = None
    # A whole model's library (a Relax VM executable, schedlang.run.leased.run_model_on_board):
    # its `main` takes the arguments as inputs and returns the outputs, in the order of
    # `expected`; `outputs` is unused.
    whole_model: bool = False

    @property
    def output_names(self) -> list[str]:
        return self.names or [f"output {i}" for i in self.outputs]


def measure_job(measurement: MeasureJob) -> Outcome:
    """`verify_then_time` of the library on this machine (`repeat` 0: verify only).

    The arguments in `poison` (outputs nothing reads) are filled with NaN, or a bit pattern for
    integers, before the run: a kernel that leaves part of an output unwritten fails. On the CPU,
    every argument lies between guard bytes (`GuardedArray`)."""
    import tvm

    module = tvm.runtime.load_module(measurement.lib_path)
    args = load_arrays(measurement.args_path)
    for index in measurement.poison or ():
        args[index] = _poisoned(args[index])
    device = tvm.device(measurement.device, 0)
    return verify_job(
        measurement,
        module,
        device,
        args,
        slow_run_s=measurement.slow_run_s,
        guard=device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type(),  # host memory only
    )


def verify_job(
    measurement: MeasureJob, module: Any, device: Any, args: list, **how: Any
) -> Outcome:
    """`verify_then_time` of the job's kernel, loaded as `module` on `device` (here, or an RPC
    session's), on `args`; `how`: verify_then_time's options that depend on where it runs. A
    whole model's (`whole_model`): `verify_then_time_model`."""
    if measurement.whole_model:
        return verify_then_time_model(
            module,
            device,
            args,
            load_arrays(measurement.expected_path),
            repeat=measurement.repeat,
            min_repeat_ms=measurement.min_repeat_ms,
            before_run=how.get("before_run"),
        )
    return verify_then_time(
        module,
        device,
        args,
        load_arrays(measurement.expected_path),
        measurement.outputs,
        measurement.output_names,
        repeat=measurement.repeat,
        min_repeat_ms=measurement.min_repeat_ms,
        prepacked=measurement.prepacked,
        **how,
    )


def run_job(**fields: Any) -> dict[str, Any]:
    """`measure_job` of a MeasureJob of these fields, its outcome as {"ok", "reason",
    "latencies_s"}: what fuzz/differential.py reads; schedlang's own callers take the Outcome
    (`measure`)."""
    outcome = measure_job(MeasureJob(**fields))
    return {"ok": outcome.is_ok, "reason": outcome.reason, "latencies_s": outcome.latencies_s}


def verify_then_time(
    module: Any,
    device: Any,
    args: list,
    expected: list,
    outputs: list[int],
    names: list[str],
    *,
    repeat: int,
    min_repeat_ms: int,
    slow_run_s: float | None = None,
    guard: bool = False,
    before_run: Callable[[], None] | None = None,
    prepacked: list[tuple[int, tuple[int, ...], str]] | None = None,
) -> Outcome:
    """Run the loaded kernel `module["main"]` once on `args` on `device` and compare its outputs
    with `expected` (a fast wrong kernel is a failure, never a result), then time it: `repeat`
    runs of at least `min_repeat_ms` each (`repeat` 0: verify only). `device` may be remote (an
    RPC session's): TVM's time evaluator runs there.

    `guard` (a CPU of this machine only): each argument between guard bytes, and a kernel writing
    past one is wrong. The verification run is timed too: if it took longer than `slow_run_s`,
    the kernel is timed with fewer repeats (`slow_timing`), so that it costs a few times its own
    latency rather than `repeat` times it; the outcome's extra "reduced_repeat" says so.
    `before_run` is called just before the kernel first runs (what fails after it may be the
    kernel's doing). `prepacked`: the library's `main` packs these weights itself, and it is
    verified so; its kernel alone is timed, on weights its packing made once
    (schedlang.run.packing)."""
    import tvm

    if guard:
        guarded = [GuardedArray(a) for a in args]
        arrays = [tvm.runtime.from_dlpack(g.array) for g in guarded]
        if before_run:
            before_run()
        started = time.perf_counter()
        module["main"](*arrays)
        first_run_s = time.perf_counter() - started
        for index, g in enumerate(guarded):
            if overrun := g.overrun():
                kind = "output" if index in outputs else "input"
                return Outcome(Status.WRONG, f"wrote out of bounds: {overrun} {kind} {index}")
        got = [guarded[i].array for i in outputs]
    else:
        tensors = [tvm.runtime.tensor(a, device) for a in args]
        if before_run:
            before_run()
        started = time.perf_counter()
        module["main"](*tensors)
        device.sync()
        first_run_s = time.perf_counter() - started
        got = [tensors[i].numpy() for i in outputs]
    ok, reason = compare_outputs(got, expected, names)
    if not ok:
        return Outcome(Status.WRONG, reason)
    if repeat == 0:
        return Outcome(Status.OK, reason)
    extra: dict[str, Any] = {}
    if slow_run_s is not None and first_run_s > slow_run_s:
        asked = repeat
        repeat, min_repeat_ms = slow_timing(repeat, first_run_s, slow_run_s)
        extra["reduced_repeat"] = {"from": asked, "to": repeat, "first_run_s": first_run_s}
    fresh = [tvm.runtime.tensor(a, device) for a in args]
    timed = "main"
    if prepacked:
        fresh = packed_once(module, device, fresh, prepacked)
        timed = "main_prepacked"
        extra["prepacked"] = [index for index, _, _ in prepacked]
    evaluator = module.time_evaluator(
        timed, device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    latencies = tuple(float(r) for r in evaluator(*fresh).results)
    return Outcome(Status.OK, reason, latencies, extra=extra)


def verify_then_time_model(
    module: Any,
    device: Any,
    inputs: list,
    expected: list,
    *,
    repeat: int,
    min_repeat_ms: int,
    before_run: Callable[[], None] | None = None,
) -> Outcome:
    """A whole model's library, loaded as `module` (a Relax VM executable, here or an RPC
    session's), run once on `inputs` on `device` and its outputs (a tuple's items, in order)
    compared with `expected`, then timed as `verify_then_time` times a kernel. The VM's stateful
    calls (`set_input`, `invoke_stateful`, `get_outputs`) are the ones that work over RPC: its
    arguments and results stay on the device until read."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    vm = VirtualMachine(module, device)
    vm.set_input("main", *(tvm.runtime.tensor(a, device) for a in inputs))
    if before_run:
        before_run()
    vm.invoke_stateful("main")
    got = _flattened(vm.get_outputs("main"))
    names = [f"output {n}" for n in range(len(expected))]
    if len(got) != len(expected):
        return Outcome(Status.WRONG, f"{len(got)} outputs, the reference has {len(expected)}")
    ok, reason = compare_outputs(got, expected, names)
    if not ok or repeat == 0:
        return Outcome(Status.OK if ok else Status.WRONG, reason)
    evaluator = vm.time_evaluator(
        "invoke_stateful", device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    latencies = tuple(float(r) for r in evaluator("main").results)
    return Outcome(Status.OK, reason, latencies)


def _flattened(result: Any) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [array for item in result for array in _flattened(item)]


def packed_once(
    module: Any, device: Any, tensors: list, prepacked: list[tuple[int, tuple[int, ...], str]]
) -> list:
    """The kernel's arguments: `tensors` with each prepacked weight replaced by what the
    library's packing makes of it, run once here as a built model runs it once at build time."""
    import tvm

    packed = [tvm.runtime.empty(shape, dtype, device) for _, shape, dtype in prepacked]
    module["main_weight_prepack"](*(tensors[index] for index, _, _ in prepacked), *packed)
    arguments = list(tensors)
    for (index, _, _), weight in zip(prepacked, packed, strict=True):
        arguments[index] = weight
    return arguments


def slow_timing(repeat: int, first_run_s: float, slow_run_s: float) -> tuple[int, int]:
    """(repeat, min_repeat_ms) for a kernel whose one run took `first_run_s` > `slow_run_s`:
    at most 3 x slow_run_s of timing after that run, and at least one repeat of one run."""
    return max(1, min(repeat, int(3 * slow_run_s / first_run_s))), 0


GUARD_BYTES = 64 * 1024  # canary bytes on each side of every argument (a multiple of 64)


class GuardedArray:
    """A copy of `array` in the middle of a larger buffer whose ends hold a canary pattern, so
    that a kernel writing past either end of its argument is caught: such a write rarely reaches
    an unmapped page and segfaults. Writes farther than GUARD_BYTES away are not caught here.

    `array` is 64-byte aligned, as TVM's kernels require of their arguments.
    """

    def __init__(self, array: Any):
        import numpy as np

        size = array.nbytes
        raw = np.empty(2 * GUARD_BYTES + size + 64, np.uint8)
        start = -raw.ctypes.data % 64
        self.buffer = raw[start : start + 2 * GUARD_BYTES + size]
        self.canary = _canary()
        self.buffer[:GUARD_BYTES] = self.canary
        self.buffer[GUARD_BYTES + size :] = self.canary
        middle = self.buffer[GUARD_BYTES : GUARD_BYTES + size]
        self.array = middle.view(array.dtype).reshape(array.shape)
        self.array[...] = array

    def overrun(self) -> str:
        """How far the kernel wrote past an end ("8 bytes after"), or "" if both guards hold."""
        import numpy as np

        after = np.flatnonzero(self.buffer[-GUARD_BYTES:] != self.canary)
        if after.size:
            return f"{_bytes(int(after[-1]) + 1)} after"
        before = np.flatnonzero(self.buffer[:GUARD_BYTES] != self.canary)
        if before.size:
            return f"{_bytes(GUARD_BYTES - int(before[0]))} before"
        return ""


def _poisoned(array: Any) -> Any:
    """A copy of `array` that no kernel computes by accident: NaN, or bytes 0x7f for integers."""
    import numpy as np

    if np.issubdtype(array.dtype, np.floating):
        return np.full_like(array, np.nan)
    return np.full(array.nbytes, 0x7F, np.uint8).view(array.dtype).reshape(array.shape)


def _bytes(count: int) -> str:
    return f"{count} byte{'s' * (count != 1)}"


@functools.cache
def _canary() -> Any:
    import numpy as np

    # Random bytes: no value a kernel computes is likely to leave a whole guard unchanged.
    return np.random.default_rng(0x5C4ED).integers(0, 256, GUARD_BYTES, dtype=np.uint8)


def load_arrays(path: str) -> list:
    """The arrays of an .npz file written by `np.savez(path, *arrays)`, in order."""
    import numpy as np

    with np.load(path) as data:
        return [data[f"arr_{n}"] for n in range(len(data.files))]
