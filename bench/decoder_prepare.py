"""The files bench/bench_decoder.py times each system on, made once per config in the work folder
and kept (a second run reuses them):

    WORKDIR/CONFIG/checkpoint/     random weights (torch seed 0), save_pretrained (safetensors),
                                   with a tokenizer trained here (a random-weight model has none)
    WORKDIR/CONFIG/model-f32.gguf  llama.cpp's convert_hf_to_gguf.py --outtype f32
    WORKDIR/CONFIG/genai/          onnxruntime-genai's builder, -p fp32 -e cpu
    WORKDIR/llama.cpp/             the converter, from the llama-cpp-python sdist (pip download)

The tokenizer: a byte-level BPE trained with `tokenizers` on this Python's own standard library
sources, with Qwen2's normalizer (NFC) and pre-tokenizer (its split regex), so that
transformers' Qwen2Tokenizer reads back the same ids. llama.cpp's converter recognizes a BPE
pre-tokenizer by the hash of the ids it gives a test string, and rejects one it does not know; a
tokenizer trained here has no entry, so the converter runs as a module with that one lookup
(`TextModel.get_vocab_base_pre`) answering "qwen2" (the regex it was trained with); nothing
else of the converter changes. Its vocabulary is smaller than the model's: the converter pads
it with [PAD] tokens, and the benchmark feeds token ids, never text.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendor/llama.cpp holds the converter
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TOKENIZER_TEXT_BYTES = 500  # of standard-library sources per token of the vocabulary, 4 MB at 8192

CONVERT = """
import runpy, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
script = sys.argv[1] + "/convert_hf_to_gguf.py"
sys.argv = [script, *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
"""


class PrepareError(Exception):
    """A file a system needs could not be made: the reason, one line."""


def run_tool(command: list[str], what: str, timeout_s: float = 7200) -> None:
    """`command` run to its end, or PrepareError with its stderr's last line."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PrepareError(f"{what}: no answer in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise PrepareError(f"{what} failed: {last_line(done.stderr or done.stdout)}")


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def checkpoint(folder: Path, shape: dict) -> Path:
    """The config's random-weight Qwen2 (seed 0) and a local tokenizer, written once."""
    out = folder / "checkpoint"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        intermediate_size=shape["intermediate"], tie_word_embeddings=shape["tied"],
        max_position_embeddings=shape["max_position"], rope_theta=shape["rope_theta"],
        rms_norm_eps=1e-6, hidden_act="silu", torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    del model
    tokenizer(min(shape["vocab"], 8192)).save_pretrained(out)
    return out


def tokenizer(vocab_size: int):
    """A byte-level BPE of `vocab_size` tokens trained on the standard library's sources."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    bpe.train_from_iterator(_stdlib_text(vocab_size * TOKENIZER_TEXT_BYTES), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],
    )  # fmt: skip


def _stdlib_text(limit: int):
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(errors="replace")
        yield text
        total += len(text)
        if total >= limit:
            return


def converter(workdir: Path, source: str | None) -> Path:
    """llama.cpp's folder holding convert_hf_to_gguf.py: `source`, or the llama-cpp-python sdist
    downloaded (pip download, no binary) into the work folder and its vendor/llama.cpp kept."""
    if source:
        return Path(source)
    folder = workdir / "llama.cpp"
    if (folder / "convert_hf_to_gguf.py").exists():
        return folder
    sdist = workdir / "sdist"
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not (sdist / name).exists():
        run_tool(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(sdist)],
            "pip download llama-cpp-python", timeout_s=900,
        )  # fmt: skip
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    with tarfile.open(sdist / name) as archive:
        for member in archive.getmembers():
            wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
            rest = member.name[len(prefix) :]
            if member.name.startswith(prefix) and rest.startswith(wanted) and member.isfile():
                member.name = rest
                archive.extract(member, folder, filter="data")
    return folder


def gguf(folder: Path, checkpoint_dir: Path, llama_cpp_dir: Path) -> Path:
    """The checkpoint as an F32 GGUF, by llama.cpp's own converter."""
    out = folder / "model-f32.gguf"
    if not out.exists():
        part = out.with_suffix(".part")
        command = [sys.executable, "-c", CONVERT, str(llama_cpp_dir), str(checkpoint_dir),
                   "--outtype", "f32", "--outfile", str(part)]  # fmt: skip
        run_tool(command, "convert_hf_to_gguf.py")
        part.rename(out)
    return out


def genai(folder: Path, checkpoint_dir: Path, threads: int) -> Path:
    """onnxruntime-genai's model of the checkpoint (its builder, fp32, cpu), its sessions set
    to `threads` intra-op threads (and one inter-op) in genai_config.json."""
    out = folder / "genai"
    config_path = out / "genai_config.json"
    if not config_path.exists():
        run_tool(
            [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint_dir),
             "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(folder / "genai-cache")],
            "onnxruntime_genai.models.builder",
        )  # fmt: skip
    config = json.loads(config_path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options.update(intra_op_num_threads=threads, inter_op_num_threads=1)
    config_path.write_text(json.dumps(config, indent=4))
    return out
