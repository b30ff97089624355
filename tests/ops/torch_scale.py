"""B = 2 * A, with a reference written in PyTorch: an op file that imports torch (issue 28: the
CLI keeps torch out of its own start-up, never out of a user's file)."""

import torch
from tvm import te

import schedlang


def reference(A):
    return (torch.from_numpy(A) * 2).numpy()


@schedlang.op(reference=reference)
def scale(N: int = 256, M: int = 64):
    A = te.placeholder((N, M), "float32", name="A")
    B = te.compute((N, M), lambda i, j: A[i, j] * 2, name="B")
    return te.create_prim_func([A, B])
