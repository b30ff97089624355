"""torch kept out of start-up, and let in for whoever asks for it.

tvm_ffi imports torch whenever it is installed (for DLPack exchange): seconds of every command's
start-up and half a sandbox worker's, for code that never touches a tensor. schedlang's entry
points (the CLI, a worker, an RPC server) mark torch absent before TVM is imported. That mark is
schedlang's choice, never the user's: before a user's op or model file runs (it may import torch,
or transformers, or anything that does), and before a local model loads, it is lifted, and
`import torch` then imports the real one.
"""

from __future__ import annotations

import sys


def defer_torch() -> None:
    """Keep tvm_ffi from importing torch at start-up (a no-op where torch is already imported)."""
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]


def allow_torch() -> None:
    """Lift `defer_torch`: the next `import torch` imports it."""
    if "torch" in sys.modules and sys.modules["torch"] is None:
        del sys.modules["torch"]
