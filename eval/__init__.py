"""Evaluation: validation loss and the lm-eval MMLU/MMMU runners.

Nothing is implemented yet.
"""
