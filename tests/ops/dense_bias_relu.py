"""Out = max(A @ W.T + bias, 0), written in TVMScript the ordinary way: the accumulator is a
function-level `T.alloc_buffer` and the epilogue a block of its own (issue 15)."""

import numpy as np
from tvm.script import tirx as T

import schedlang


def reference(A, W, bias):
    return np.maximum(A @ W.T + bias, 0)


@schedlang.op(reference=reference)
def dense_bias_relu(M: int = 128, N: int = 96, K: int = 64):
    @T.prim_func(s_tir=True)
    def dense(
        A: T.Buffer((M, K), "float32"),
        W: T.Buffer((N, K), "float32"),
        bias: T.Buffer((N,), "float32"),
        Out: T.Buffer((M, N), "float32"),
    ):
        acc = T.alloc_buffer((M, N), "float32")
        for i, j, k in T.grid(M, N, K):
            with T.sblock("acc"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + A[vi, vk] * W[vj, vk]
        for i, j in T.grid(M, N):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [i, j])
                Out[vi, vj] = T.max(acc[vi, vj] + bias[vj], T.float32(0))

    return dense
