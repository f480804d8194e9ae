"""Evaluation: validation loss, MMLU through lm-eval, MMMU multiple-choice and
generated-answer, on any checkpoint the train entry point writes.

One command per evaluator, each writing one result JSON (schema: ``result.schema.json``):

    python -m eval.val_loss   held-out per-token loss (the number is defined once, in
                              `experiments.train.validation`, which the train loop calls)
    python -m eval.mmlu       lm-eval ``mmlu`` (hub) or ``mmlu_local`` (local files)
    python -m eval.mmmu_mc    MMMU multiple-choice by answer-letter log-likelihood
    python -m eval.mmmu_gen   MMMU generated answers with lm-eval's extraction
    (the small local task files in the real formats: python -m experiments.data.task_fixtures)

`eval.checkpoint.load_checkpoint` loads every checkpoint layout for all of them. See
docs/evaluation.md.
"""
