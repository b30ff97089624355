"""A language model as the proposer: backends, decoding grammar, stepwise decoding, prompts,
feedback, evaluation.
"""
