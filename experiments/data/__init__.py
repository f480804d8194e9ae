"""Data pipeline: proxy datasets, local tokenizer/processor/model assets, preprocessing.

ODB groups samples by their *post-pipeline* length (chat template, tokenization, visual
token expansion, cutoff), which is only known after preprocessing. This package provides:

- `proxies`: seeded generators that write the four paper datasets in their real schemas,
  calibrated so that post-pipeline length CVs match the paper (SPEC.md section 4);
- `assets`: a locally trained tokenizer with the Qwen3-VL special tokens and chat
  template, the Qwen-VL image processor, and a tiny config-built Qwen3-VL;
- `pipeline`: the map-style preprocessing dataset (one model-ready sample per item);
- `length_stats`: the length-statistics command.
"""
