"""Baseline loaders compared against ODB: Standard, Sorted, GMT/BMT length-cache, Packing.

They share ODB's loader interface and step info so recipes can swap methods freely.
Libraries only: no experiment paths, grids or environment reads. Nothing is
implemented yet.
"""
