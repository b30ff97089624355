"""The language: the AST (nodes), text ⇄ AST (syntax, printer), the statement registry, the live
schedule with schedlang's names (nest).
"""
