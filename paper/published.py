"""The paper's published numbers, for the report to set beside ours (data, no code).

Sources: the paper's summary (seed document) and the benchmark table of the authors'
repository (online-dynamic-batching/online-dynamic-batching README, docs/benchmarks.md),
as collected in the project's reference notes.
"""

# ODB speedup over Standard, ranges over the paper's settings
SPEEDUP_RANGES = {"1 node (full FT / LoRA)": (1.58, 2.51), "2 nodes (full FT)": (1.71, 3.78)}

# (dataset, setting, Standard samples/s, ODB samples/s, speedup)
THROUGHPUT = [
    ("mmmix", "2b full 2N (16x H20)", 17.85, 79.15, 4.43),
    ("ultrachat", "8b full 1N (8x H20)", 5.77, 10.23, 1.77),
    ("llava", "8b full 1N (8x H20)", 14.38, 24.87, 1.73),
    ("sharegpt4o", "8b full 1N (8x H20)", 2.37, 5.83, 2.46),
]
SHAREGPT4O_2B_SPEEDUP = 2.47
SORTED_SHAREGPT4O_SPEEDUP = 1.03

# (dataset, setting, benchmark, ODB, Standard or other methods as "name=value")
QUALITY = [
    ("ultrachat", "8b full", "MMLU %", "ODB 74.75", "Packing 75.18, GMT 75.14"),
    ("ultrachat", "2b full 2N", "MMLU %", "ODB 59.09", "Standard 58.82"),
    ("llava", "-", "MMMU-MC %", "ODB 54.08", "Standard 55.88"),
    ("sharegpt4o", "-", "MMMU-MC %", "ODB 53.88", "Standard 52.43"),
    ("mmmix", "2b full 2N", "MMMU-MC %", "ODB 46.31 ± 0.44", "Standard 43.33 ± 2.24"),
    ("llava", "-", "MMMU generated %", "-", "Standard 22.30, Sorted 5.52 (format drift)"),
]
