"""The recipes of the built-in proposer: one module per kind of op, each defining its `Rule`
classes (schedlang.propose.template). They are found here by module, so a new recipe is a new
module in this folder, with its `rank`, and its test; nothing else lists them."""

from __future__ import annotations

import importlib
import pkgutil

from schedlang.propose.template import Rule

TARGETS = ("cpu", "gpu")


def _found() -> tuple[Rule, ...]:
    """One of each rule class the modules here define, by target (CPU first), then rank."""
    rules: list[Rule] = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        rules += [
            value()
            for value in vars(loaded).values()
            if isinstance(value, type)
            and issubclass(value, Rule)
            and value.__module__ == loaded.__name__
        ]
    return tuple(sorted(rules, key=lambda rule: (TARGETS.index(rule.target), rule.rank)))


RULES = _found()
