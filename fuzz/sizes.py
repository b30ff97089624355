"""The example ops (examples/*.py) at odd, prime and tiny sizes, set through their parameters as
`schedlang run OP.py -D M=67` sets them.

The examples' own schedules are written for sizes that powers of two divide; at 67 or 5 every
split leaves a remainder, a tile has a partial last tile, and a padding border is wider than the
interior. Sizes are bounded so that one run takes milliseconds.
"""

from __future__ import annotations

import math

from fuzz.mutate import Example
from fuzz.nests import Chooser

ODD = (1, 2, 3, 5, 7, 11, 13, 17, 31, 33, 45, 64, 67, 97)
TINY = (1, 2, 3, 5, 7, 9, 11, 13)
MAX_POINTS = 1 << 17  # iterations of the largest block


def _dims(chooser: Chooser, names: str, sizes=ODD) -> dict[str, int]:
    return {name: chooser.choice(sizes) for name in names.split()}


def _matmul(chooser: Chooser) -> dict[str, int]:
    return _dims(chooser, "M N K")


def _batch_matmul(chooser: Chooser) -> dict[str, int]:
    return {"batch": chooser.choice([1, 2, 3]), **_dims(chooser, "M N K")}


def _window(chooser: Chooser) -> dict[str, int]:
    params = {"N": chooser.choice([1, 2]), "C": chooser.choice([1, 2, 3, 5, 7])}
    params |= _dims(chooser, "H W", (*TINY, 17, 31))
    params |= {"R": chooser.choice([3, 1, 2, 5]), "stride": chooser.choice([1, 2, 3])}
    return params | {"pad": chooser.choice([1, 0, 2])}


def _conv2d(chooser: Chooser) -> dict[str, int]:
    return {**_window(chooser), "K": chooser.choice([1, 2, 3, 5])}


def _rows(chooser: Chooser) -> dict[str, int]:
    return {"rows": chooser.choice(ODD), "cols": chooser.choice(ODD)}


OPS = {
    "matmul.py": _matmul,
    "matmul_4x4.py": _matmul,
    "batch_matmul.py": _batch_matmul,
    "conv2d.py": _conv2d,
    "depthwise_conv2d.py": _window,
    "layernorm.py": _rows,
    "softmax.py": _rows,
}


def odd_sized_example(chooser: Chooser, op_file: str | None = None) -> Example:
    """An example op (`op_file`, or one drawn) at drawn sizes, with no schedule text."""
    op_file = op_file or chooser.choice(sorted(OPS))
    params = OPS[op_file](chooser)
    while math.prod(params.values()) * 9 > MAX_POINTS:  # shrink the largest
        largest = max(params, key=params.__getitem__)
        params[largest] = chooser.choice([1, 2, 3, 5, 7])
    if "R" in params:  # the padded input holds at least one window
        short = params["R"] - min(params["H"], params["W"])
        params["pad"] = max(params["pad"], math.ceil(short / 2))
    defines = tuple((name, str(value)) for name, value in params.items())
    return Example(op_file, "", op_file, defines, False)


def define_flags(example: Example) -> str:
    """`-D M=67 -D N=45` for the command line."""
    return " ".join(f"-D {name}={value}" for name, value in example.defines)
