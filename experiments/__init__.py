"""Recipes: data pipeline, model builders, the train entry point, configs and rule files.

Recipes compose `odb` and `baselines`; Snakemake rule files live in `experiments/rules/`,
the grid they run in `experiments/grid.py`.
"""
