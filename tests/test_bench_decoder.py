"""bench/bench_decoder.py at a tiny config (2 layers, width 64): schedlang (untuned) and PyTorch
eager always, the other systems where they are installed; every row is in the report, the
greedy tokens agree with eager's, the roofline's figures are consistent, and a system that
fails is a row with its reason."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import bench_decoder  # noqa: E402
import decoder_report  # noqa: E402

STEPS = 3
OPTIONAL = {"ortgenai": "onnxruntime_genai", "llamacpp": "llama_cpp"}


def why_not(system: str) -> str | None:
    """Why an optional system is left out here, or None."""
    module = OPTIONAL[system]
    if importlib.util.find_spec(module) is None:
        return f"{system}: {module} is not installed (the llm-bench extra)"
    if system == "llamacpp" and not os.environ.get("LLAMA_CPP_DIR"):
        return "llamacpp: set LLAMA_CPP_DIR to llama.cpp's folder with convert_hf_to_gguf.py"
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny run of schedlang, eager and the optional systems installed (llama.cpp's converter
    from $LLAMA_CPP_DIR: the test downloads nothing)."""
    folder = tmp_path_factory.mktemp("bench")
    systems = ["schedlang", "eager", *[s for s in OPTIONAL if not why_not(s)]]
    argv = [
        "--configs", "tiny", "--systems", ",".join(systems), "--rounds", "1",
        "--prefill", "8,16", "--contexts", "8,16", "--steps", str(STEPS),
        "--workdir", str(folder / "work"), "--out", str(folder / "out.md"), "--bandwidth-mib", "16",
    ]  # fmt: skip
    if os.environ.get("LLAMA_CPP_DIR"):
        argv += ["--llama-cpp-dir", os.environ["LLAMA_CPP_DIR"]]
    results = bench_decoder.Bench(bench_decoder.parse_args(argv)).run()
    return folder, systems, results


def test_every_system_is_a_row_and_the_machine_is_described(run):
    folder, systems, _ = run
    saved = json.loads((folder / "out.json").read_text())
    assert list(saved["configs"]["tiny"]["runs"]) == systems
    text = decoder_report.render(saved)
    for system in systems:
        assert f"| {decoder_report.NAMES[system]} |" in text
    machine = saved["machine"]
    assert f"LLVM host cpu `{machine['llvm_cpu']}`" in text and "unknown" not in machine["llvm_cpu"]
    assert machine["cores"] >= 1 and len(machine["load_after"]) == 3
    assert "## tiny: 2 layers, width 64" in text


def test_schedlang_and_eager_agree_on_every_greedy_token(run):
    _, _, results = run
    entry = results["configs"]["tiny"]
    rows = decoder_report.summarize_config(entry, decoder_report.best_bandwidth(results))
    for system in ("schedlang", "eager"):
        row = rows[system]
        assert row["rounds"] == 1, row["errors"]
        for context in ("8", "16"):
            assert row["decode"][context]["agreement"] == STEPS + 1
            assert row["decode"][context]["tokens_per_s"]["median"] > 0
        assert row["prefill"]["16"]["median"] > 0 and row["peak_rss_bytes"] > 0


def test_the_roofline_fraction_is_tokens_per_s_times_bytes_over_bandwidth(run):
    _, _, results = run
    bandwidth = decoder_report.best_bandwidth(results)
    assert bandwidth and bandwidth > 1e8  # bytes/s
    entry = results["configs"]["tiny"]
    rows = decoder_report.summarize_config(entry, bandwidth)
    for context, decode in rows["schedlang"]["decode"].items():
        read = bench_decoder.step_bytes(entry["shape"], int(context) + (STEPS + 1) / 2)
        assert decode["step_bytes"] == read
        expected = decode["tokens_per_s"]["median"] * read / bandwidth
        assert decode["roofline_fraction"] == pytest.approx(expected)


@pytest.mark.parametrize("system", sorted(OPTIONAL))
def test_an_optional_system_installed_gives_eagers_tokens(run, system):
    if why_not(system):
        pytest.skip(why_not(system))
    _, _, results = run
    rows = decoder_report.summarize_config(results["configs"]["tiny"], None)
    assert rows[system]["rounds"] == 1, rows[system]["errors"]
    for decode in rows[system]["decode"].values():
        assert decode["agreement"] == STEPS + 1 and decode["roofline_fraction"] is None


def test_a_system_that_cannot_be_prepared_or_fails_is_a_row_with_its_reason(run, tmp_path):
    folder, _, results = run
    (tmp_path / "work" / "tiny").mkdir(parents=True)  # the run's checkpoint, not its GGUF
    (tmp_path / "work" / "tiny" / "checkpoint").symlink_to(folder / "work" / "tiny" / "checkpoint")
    argv = [
        "--configs", "tiny", "--systems", "llamacpp", "--rounds", "1", "--prefill", "8",
        "--contexts", "8", "--workdir", str(tmp_path / "work"),
        "--out", str(tmp_path / "failed.md"), "--llama-cpp-dir", str(tmp_path / "nothing"),
    ]  # fmt: skip
    bench = bench_decoder.Bench(bench_decoder.parse_args(argv))
    entry = bench.prepare("tiny")
    assert "convert_hf_to_gguf.py failed" in entry["unavailable"]["llamacpp"]
    bench.measure("tiny")
    text = decoder_report.render(bench.results)
    assert "| llama.cpp F32 | failed: convert_hf_to_gguf.py failed" in text
    assert json.loads((tmp_path / "failed.json").read_text())["configs"]["tiny"]["unavailable"]
    # A system's own process failing: its stderr's last line.
    spec = {**results["configs"]["tiny"]["spec"], "genai_dir": str(tmp_path / "missing")}
    failed = bench_decoder.run_system("ortgenai", spec, timeout_s=120)
    assert failed["error"] and "Traceback" not in failed["error"]


def test_bytes_per_decode_step_count_the_weights_a_step_reads():
    shape = bench_decoder.SHAPES["1.5b"]
    # the 7.11 GB: every parameter, both the embedding table and the untied LM head
    assert bench_decoder.parameters(shape) * 4 / 1e9 == pytest.approx(7.11, abs=0.01)
    # a step reads one row of the embedding table, and the cache: 28 layers x K,V x 256 floats
    table = shape["vocab"] * shape["hidden"] * 4
    weights = bench_decoder.parameters(shape) * 4 - table + shape["hidden"] * 4
    assert bench_decoder.step_bytes(shape, 0) == weights
    assert bench_decoder.step_bytes(shape, 10) - weights == 28 * 2 * 256 * 10 * 4


def test_a_cache_too_short_for_the_lengths_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench_decoder.parse_args(["--configs", "tiny", "--contexts", "128"])
    assert "a cache of 128 tokens is shorter" in capsys.readouterr().err
