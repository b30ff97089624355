"""Decoder LLMs built by schedlang (schedlang.models.decoder) agree with transformers.

A tiny Qwen2 (q/k/v biases, tied embeddings) and a tiny Llama (biases on q/k/v/o, untied
embeddings, rope_theta 500,000), random weights, built offline; each is built once per session.
Logits are compared in float32 with an absolute tolerance of 1e-4 (the logits are of order 1;
what differs is the order of the float32 sums), greedy tokens exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from schedlang import cli
from schedlang.core.diagnostics import SchedlangError
from schedlang.models import decoder
from schedlang.models.decoder.config import DecoderConfig

ATOL = 1e-4
MAX_LENGTH = 48
EXAMPLE = "examples/llm/tiny_qwen2.py"


def _tiny(family: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(1)
    shapes = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,  # greedy decoding then does not repeat one token
    )
    if family == "qwen2":
        config, model_class = Qwen2Config(tie_word_embeddings=True, **shapes), Qwen2ForCausalLM
    else:
        config = LlamaConfig(attention_bias=True, rope_theta=5e5, **shapes)
        model_class = LlamaForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    model = model_class(config).eval()
    if family == "llama":  # transformers starts biases at zero: make them count
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("bias"):
                    param.normal_(0, 0.2)
    return model


@pytest.fixture(scope="session", params=["qwen2", "llama"])
def pair(request):
    """(the transformers model, schedlang's build of it)."""
    model = _tiny(request.param)
    return model, decoder.load(model, max_length=MAX_LENGTH)


def _reference_logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0, -1].numpy()


def _reference_tokens(model, prompt, new_tokens: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


PROMPT = [int(t) for t in np.random.default_rng(7).integers(0, 300, MAX_LENGTH)]


@pytest.mark.parametrize("length", [1, 7, 30])
def test_prefill_matches_transformers_at_several_lengths(pair, length):
    model, built = pair
    built.reset()
    logits = built.prefill(PROMPT[:length])
    np.testing.assert_allclose(logits, _reference_logits(model, PROMPT[:length]), atol=ATOL)
    assert built.length == length


def test_the_cache_carries_across_calls(pair):
    """Two prefills and three decodes in a row: each call's logits are those of the whole
    sequence so far."""
    model, built = pair
    built.reset()
    built.prefill(PROMPT[:5])
    np.testing.assert_allclose(
        built.prefill(PROMPT[5:9]), _reference_logits(model, PROMPT[:9]), atol=ATOL
    )
    for position in range(9, 12):
        logits = built.decode(PROMPT[position])
        np.testing.assert_allclose(
            logits, _reference_logits(model, PROMPT[: position + 1]), atol=ATOL
        )
    assert built.length == 12


@pytest.mark.parametrize("length", [1, 7, 13])
def test_prefill_after_a_cached_prompt_matches_transformers(pair, length):
    """The fused prefill attention (attention_prefill.py) with past > 0: its query blocks and
    key blocks start off the cached length, and 13 leaves a tail of both."""
    model, built = pair
    built.reset()
    built.prefill(PROMPT[:6])
    logits = built.prefill(PROMPT[6 : 6 + length])
    reference = _reference_logits(model, PROMPT[: 6 + length])
    np.testing.assert_allclose(logits, reference, atol=ATOL)
    assert built.length == 6 + length


def test_greedy_tokens_are_those_of_transformers_generate(pair):
    model, built = pair
    result = built.generate(PROMPT[:10], 12)
    expected = _reference_tokens(model, PROMPT[:10], 12)
    assert list(result.tokens) == expected
    assert len(set(expected)) > 1  # the comparison means something
    assert result.prefill_tokens_per_s > 0 and result.decode_tokens_per_s > 0


def test_a_prompt_past_the_maximum_length_is_refused(pair):
    _, built = pair
    built.reset()
    with pytest.raises(SchedlangError, match=r"49 more tokens do not fit: the cache holds 48"):
        built.prefill([*PROMPT, 1])
    built.prefill(PROMPT)  # exactly full is fine
    with pytest.raises(SchedlangError, match=r"1 more tokens do not fit.*48 used"):
        built.decode(3)
    with pytest.raises(SchedlangError, match="outside the vocabulary"):
        built.reset() or built.prefill([300])


def test_lengths_must_be_positive_integers(pair):
    model, built = pair
    for bad in (0, -4, 2.5, True):
        with pytest.raises(SchedlangError, match="must be a positive integer"):
            decoder.load(model, max_length=bad)
    with pytest.raises(SchedlangError, match="new_tokens must be a positive integer, got 0"):
        built.generate(PROMPT[:3], 0)
    with pytest.raises(SchedlangError, match="non-empty"):
        built.prefill([])


def test_unsupported_architectures_and_variants_are_one_line_each():
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1}
    base |= {"intermediate_size": 96, "vocab_size": 300}
    cases = {
        "GPT2LMHeadModel": "unsupported architecture GPT2LMHeadModel: schedlang builds "
        "Qwen2ForCausalLM, LlamaForCausalLM",
    }
    for architecture, message in cases.items():
        with pytest.raises(SchedlangError) as caught:
            DecoderConfig.from_hf({**base, "architectures": [architecture]})
        assert caught.value.message == message
    linear = {**base, "model_type": "llama", "rope_parameters": {"rope_type": "linear"}}
    with pytest.raises(SchedlangError, match="rope scaling `linear` is not supported"):
        DecoderConfig.from_hf(linear)
    default = {**base, "model_type": "qwen2", "rope_scaling": None, "rope_theta": 1e6}
    assert DecoderConfig.from_hf(default).rope_theta == 1e6


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A tiny Qwen2 saved as transformers saves it (config.json, model.safetensors)."""
    folder = tmp_path_factory.mktemp("checkpoint")
    model = _tiny("qwen2")
    model.save_pretrained(folder)
    return model, folder


def _cli(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def test_generate_from_a_checkpoint_folder_on_the_command_line(checkpoint):
    model, folder = checkpoint
    result = _cli("generate", str(folder), "--prompt-tokens", "9", "--new-tokens", "6", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    prompt = np.random.default_rng(0).integers(0, 300, 9).tolist()  # --seed 0
    assert document["tokens"] == _reference_tokens(model, prompt, 6)
    assert document["prefill_tokens_per_s"] > 0 and document["decode_tokens_per_s"] > 0


def test_generate_from_a_model_file_prints_tokens_per_second():
    result = _cli("generate", EXAMPLE, "--prompt-tokens", "8", "--new-tokens", "4")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Qwen2ForCausalLM: ") and len(lines[0].split()) == 5
    assert lines[1].startswith("prefill 8 tokens: ") and lines[1].endswith(" tokens/s")
    assert lines[2].startswith("decode 3 tokens: ") and lines[2].endswith(" tokens/s")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--new-tokens", "0"], "error: new tokens must be a positive integer, got 0"),
        (["--prompt-tokens", "-3"], "error: prompt tokens must be a positive integer, got -3"),
        (["--max-length", "0"], "error: max_length must be a positive integer, got 0"),
        (
            ["--prompt-tokens", "20", "--max-length", "10"],
            "error: a prompt of 20 tokens is longer than the maximum length 10",
        ),
    ],
)
def test_bad_lengths_on_the_command_line_are_one_error_line(checkpoint, args, message):
    result = _cli("generate", str(checkpoint[1]), *args)
    assert result.exit_code == 1
    assert result.stderr.strip() == message


def _copy(folder, tmp_path):
    for file in folder.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    return tmp_path


def test_a_checkpoint_with_a_missing_or_damaged_file_is_one_error_line(checkpoint, tmp_path):
    folder = _copy(checkpoint[1], tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    result = _cli("generate", str(folder))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {weights}: damaged safetensors file: ")
    assert len(result.stderr.strip().splitlines()) == 1
    weights.unlink()
    result = _cli("generate", str(folder))
    assert (
        result.stderr.strip() == f"error: {folder}: no *.safetensors file: the weights are missing"
    )
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    result = _cli("generate", str(folder))
    assert result.stderr.strip() == (
        f"error: {folder}: weight file model-00002-of-00002.safetensors is missing "
        "(model.safetensors.index.json lists it)"
    )
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "architectures": ["MambaForCausalLM"]})
    )
    result = _cli("generate", str(folder))
    assert result.stderr.strip() == (
        "error: unsupported architecture MambaForCausalLM: schedlang builds Qwen2ForCausalLM, "
        "LlamaForCausalLM"
    )


def test_the_kernels_are_plain_primfuncs_with_symbolic_lengths():
    """What a tuner sees: one PrimFunc per kernel, n and past symbolic in prefill's."""
    from schedlang.models.decoder.build import export, kernels

    config = DecoderConfig.from_hf(_tiny("qwen2").config.to_dict(), "Qwen2ForCausalLM")
    found = {kernel.name: kernel for kernel in kernels(export(config, MAX_LENGTH)[0])}
    assert {"attention_prefill", "attention", "cache_append", "qkv_proj", "lm_head"} <= set(found)
    assert found["attention_prefill"].callers == ("prefill",)  # the fused kernel
    assert found["attention"].callers == ("decode",)  # kernels.attention, one query
    assert any("n" in shape for shape in found["attention_prefill"].shapes)


def test_a_schedule_pass_runs_on_every_kernel_of_the_build(checkpoint, tmp_path):
    """The slot for tuned schedules: the tuning database's pass sees each PrimFunc (an empty
    database leaves each as it is) and the build still decodes as transformers does."""
    from schedlang.models.graph import ApplySchedlangDatabase
    from schedlang.store.db import Database

    model, folder = checkpoint
    schedule = ApplySchedlangDatabase(Database(str(tmp_path / "empty.db")), "llvm")
    built = decoder.load(folder, max_length=16, schedule=schedule)
    names = {applied.function for applied in schedule.applied}
    assert {"attention", "cache_append", "qkv_proj"} <= names
    how = {applied.function: applied.how for applied in schedule.applied}
    assert how.pop("attention_prefill") == "scheduled before"  # it comes scheduled
    assert set(how.values()) == {"unscheduled"}
    assert list(built.generate(PROMPT[:4], 5).tokens) == _reference_tokens(model, PROMPT[:4], 5)


def test_a_missing_or_misshapen_weight_is_named_before_any_build(checkpoint):
    model, _ = checkpoint
    state = dict(model.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        SchedlangError, match=r"^the weights lack `model.layers.1.mlp.up_proj.weight`$"
    ):
        decoder.load((model.config, state), max_length=8)
    state["model.layers.1.mlp.up_proj.weight"] = state["model.layers.1.mlp.gate_proj.weight"][:5]
    with pytest.raises(SchedlangError, match=r"has shape \[5, 64\], the config says \[96, 64\]"):
        decoder.load((model.config, state), max_length=8)


def test_a_bfloat16_checkpoint_is_built_in_float32(tmp_path):
    """Real checkpoints (VibeThinker's, Qwen's) are stored in bfloat16: read, then widened."""
    import torch

    model = _tiny("qwen2").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    built = decoder.load(tmp_path, max_length=8)
    # Read back widened (`model.float()` would keep the rotary frequencies rounded to bfloat16).
    widened = type(model).from_pretrained(tmp_path, dtype=torch.float32).eval()
    np.testing.assert_allclose(
        built.prefill(PROMPT[:6]), _reference_logits(widened, PROMPT[:6]), atol=ATOL
    )


def test_a_checkpoint_is_read_one_tensor_at_a_time_through_one_handle_per_file(
    checkpoint, monkeypatch
):
    """weights._FileTensors: each tensor as safetensors reads it, each file opened once for
    the whole load (not once per tensor), and closed when the load is done."""
    from safetensors.numpy import load_file

    from schedlang.models.decoder import weights

    opened = []

    def counting(path, *args, **kwargs):
        opened.append(Path(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(weights, "open", counting, raising=False)
    file = checkpoint[1] / "model.safetensors"
    config, tensors = weights.read_source(checkpoint[1])
    expected = load_file(file)
    assert sorted(tensors) == sorted(expected)
    for name, array in expected.items():
        assert tensors.shape(name) == array.shape
        np.testing.assert_array_equal(tensors[name], array)
    assert len(list(weights.laid_out(config, tensors))) > 0
    assert opened == [file]
    assert not tensors._handles  # closed by laid_out


def test_projection_matrices_are_stored_as_column_panels():
    """weights.as_panels: [out, in] as [out / P, in, P], element [j // P, k, j % P] = W[j, k];
    P is 32 where it divides the outputs (VibeThinker's 151,936), else a smaller power of two."""
    from schedlang.models.decoder.weights import as_panels, laid_out, panel_width, paneled

    assert (panel_width(151936), panel_width(17920), panel_width(300), panel_width(7)) == (
        32, 32, 4, 1,
    )  # fmt: skip
    matrix = np.arange(64 * 5, dtype=np.float32).reshape(64, 5)
    panels = as_panels(matrix)
    assert panels.shape == (2, 5, 32) and panels[1, 3, 7] == matrix[39, 3]
    model = _tiny("llama")  # untied: the LM head in panels, the table as it is
    config = DecoderConfig.from_hf(model.config.to_dict(), "LlamaForCausalLM")
    shapes = {name: array.shape for name, array in laid_out(config, model.state_dict())}
    assert shapes["lm_head"] == (300 // 4, 64, 4) and shapes["embed"] == (300, 64)
    assert shapes["layers.0.mlp.gate_up"] == (2 * 96 // 32, 64, 32)
    assert "embed" in paneled(DecoderConfig.from_hf(_tiny("qwen2").config.to_dict()))
