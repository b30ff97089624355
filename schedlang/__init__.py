"""schedlang: a schedule language for Apache TVM."""

__version__ = "0.1.0"
