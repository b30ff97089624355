"""schedlang: a schedule language for Apache TVM."""

__version__ = "0.1.0"

from schedlang.op import op  # noqa: E402, F401
