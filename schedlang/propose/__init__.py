"""Proposers: where the tuner's schedule templates come from.

    interface   Context, Proposal, Proposer: all a consumer (the tuner, the model proposer) needs
    builtin     BuiltinProposer, which needs no model, and its catalog (`describe_templates`)
    analysis    the loop-nest analysis the recipes share: blocks, accesses, a matmul's roles, …
    template    what a recipe is (`Rule`, with `applies` and `write`) and writes with (`Writer`,
                `pick`)
    rules/      the recipes, one module per kind of op, as TVM's dlight writes them: matmul, conv,
                rows, reduction, generic (CPU); gpu_matmul, gpu_generic (GPU)

A new template is one file and its test: a module in rules/ with a `Rule` subclass (its target,
its rank among that target's rules, its `TemplateInfo` for the catalog, `applies` and `write`),
and a test in tests/test_propose.py. The rules are found by module; nothing else lists them.
"""
