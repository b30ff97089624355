"""Workflows: what a Python user or a build system calls to tune an op or a model, build a model,
or evaluate a model as a proposer. Each returns a result object and reports progress as events
(schedlang.workflows.events) to a sink the caller passes; the CLI is one such caller.

    from schedlang.workflows import tune_op, tune_model, build_model, evaluate_model
    from schedlang.workflows import tune_decoder, build_decoder  # a decoder LLM

Importing this package is cheap: each function's module is imported on first use.
"""

from importlib import import_module

_EXPORTS = {
    "tune_op": "schedlang.workflows.op_tuning",
    "tune_op_steps": "schedlang.workflows.op_tuning",
    "OpTuneResult": "schedlang.workflows.op_tuning",
    "TuneInterrupted": "schedlang.workflows.op_tuning",
    "proposer_named": "schedlang.workflows.op_tuning",
    "tune_model": "schedlang.workflows.model_tuning",
    "tune_model_steps": "schedlang.workflows.model_tuning",
    "ModelTuneResult": "schedlang.workflows.model_tuning",
    "ModelTuneInterrupted": "schedlang.workflows.model_tuning",
    "build_model": "schedlang.workflows.model_build",
    "build_model_steps": "schedlang.workflows.model_build",
    "ModelBuildResult": "schedlang.workflows.model_build",
    "tune_decoder": "schedlang.workflows.decoder_model",
    "tune_decoder_steps": "schedlang.workflows.decoder_model",
    "build_decoder": "schedlang.workflows.decoder_model",
    "build_decoder_steps": "schedlang.workflows.decoder_model",
    "DecoderBuildResult": "schedlang.workflows.decoder_model",
    "evaluate_model": "schedlang.workflows.evaluation",
    "evaluate_model_steps": "schedlang.workflows.evaluation",
    "EvalResult": "schedlang.workflows.evaluation",
    "Steps": "schedlang.workflows.events",
    "run_steps": "schedlang.workflows.events",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'schedlang.workflows' has no attribute {name!r}")
