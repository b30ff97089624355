"""Whole models: Relax modules, PyTorch and ONNX models, their tasks tuned and built."""
