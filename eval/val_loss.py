"""The ``evaluate`` rule's validation loss of a checkpoint: load it, score the held-out
split with :func:`experiments.train.validation.validation_loss` (the number the train
loop's validation reports, one definition), write the result JSON.

    python -m eval.val_loss --checkpoint runs/x/final --dataset mmmix \\
        --source data/proxies/mmmix --holdout-samples 64 --out results/eval/x/val_loss.json
"""

from __future__ import annotations

import argparse
import json
import time

from experiments.train.validation import validation_loss


def run(cfg) -> dict:
    """Load ``cfg.checkpoint``, score the held-out split, write and return the record."""
    from eval.checkpoint import load_checkpoint
    from eval.results import result_record, write_result
    from experiments.data.pipeline import PreprocessedDataset
    from experiments.data.records import DataConfig, data_files

    started = time.perf_counter()
    model, tokenizer, _, meta = load_checkpoint(
        cfg.checkpoint, dtype=cfg.torch_dtype, device=cfg.device
    )
    if cfg.data_from_run:
        data_cfg = _run_data_config(cfg.checkpoint)
    else:
        data_cfg = DataConfig(
            cfg.dataset,
            cfg.source,
            cfg.processor or meta.processor,
            cutoff_len=cfg.cutoff_len,
            image_max_pixels=cfg.image_max_pixels,
            max_samples=cfg.max_samples,
            holdout_samples=cfg.holdout_samples,
            holdout=True,
        )
    dataset = PreprocessedDataset(data_cfg)
    out = validation_loss(
        model,
        dataset,
        token_budget=cfg.token_budget,
        pad_token_id=dataset.tokenizer.pad_token_id,
        device=cfg.device,
    )
    record = result_record(
        "val_loss",
        config=cfg,
        meta=meta,
        model=model,
        task=f"val_loss_{data_cfg.dataset}",
        split="holdout",
        shots=0,
        chat_template=True,
        items_scored=out["samples"],
        items_excluded=0,
        accuracy=None,
        per_category={},
        metrics=out | {"fingerprint": dataset.fingerprint()},
        source=data_cfg.source,
        local_data=data_files(data_cfg) is not None,
        started=started,
    )
    write_result(record, cfg.out)
    return record


def _run_data_config(checkpoint: str):
    """The training run's own data settings, reading its held-out split."""
    from eval.checkpoint import training_config
    from experiments.data.records import DataConfig

    data = dict(training_config(checkpoint)["data"])
    if not data.get("holdout_samples"):
        raise ValueError(
            f"the run of {checkpoint} held out no samples (data.holdout_samples=0): it has "
            "no validation split; pass --source and --holdout-samples explicitly"
        )
    return DataConfig(**{**data, "holdout": True})


def main(argv: list[str] | None = None) -> dict:
    from eval.config import DTYPES, VAL_LOSS_DATASETS, ValLossConfig

    parser = argparse.ArgumentParser(
        prog="python -m eval.val_loss", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True, help="result JSON path")
    parser.add_argument(
        "--data-from-run",
        action="store_true",
        help="take every data setting from the run's trainer_state.json",
    )
    parser.add_argument("--dataset", default="mmmix", choices=VAL_LOSS_DATASETS)
    parser.add_argument("--source", default="", help="the training data, as in training")
    parser.add_argument("--holdout-samples", type=int, default=0)
    parser.add_argument("--max-samples", type=int, default=0)
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--image-max-pixels", type=int, default=768 * 768)
    parser.add_argument("--cutoff-len", type=int, default=16384)
    parser.add_argument("--processor", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    args = parser.parse_args(argv)
    record = run(ValLossConfig(**{k: v for k, v in vars(args).items()}))
    print(json.dumps({k: record[k] for k in ("benchmark", "task", "metrics", "scale")}, indent=2))
    return record


if __name__ == "__main__":
    main()
