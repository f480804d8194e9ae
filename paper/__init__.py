"""Result JSON -> the paper's tables (LaTeX + Markdown), figures and report.

Reads result files only; must not import torch. Nothing is implemented yet.
"""
