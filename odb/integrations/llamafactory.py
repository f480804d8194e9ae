"""LLaMA-Factory's SFT stage with ODB batches: its data and model set-up, ``ODBTrainer``'s loop.

    torchrun --nproc_per_node 2 -m odb.integrations.llamafactory recipe.yaml   # CPU, Gloo
    python -m odb.integrations.llamafactory recipe.yaml                        # one process

The recipe is a LLaMA-Factory SFT YAML (``stage: sft``) plus one ``odb:`` section, the
:class:`odb.ODBLoader` options (``token_budget`` at least). LLaMA-Factory has no switch
for another trainer, so this launcher stands in for its ``run_sft`` (checked against
llamafactory 0.9.5, ``train/sft/workflow.py``): the same argument parsing
(``get_train_args``), tokenizer, template, tokenised dataset (``get_dataset``), model
(``load_model``, LoRA and freezing included) and collator (with its padding), then a
trainer that is LLaMA-Factory's ``CustomSeq2SeqTrainer`` (its optimizers, schedulers and
callbacks) with :class:`~odb.integrations.hf_trainer.ODBTrainer` before it in the method
order: ODB forms the batches from the tokenised samples and the loss is the exact
per-token mean of each accumulation window. What is replaced: the sampler and the
``per_device_train_batch_size`` (a token budget sets the batches), the loss normaliser.

Refused, with what to change (:func:`check_recipe`): ``packing`` and ``neat_packing``
(LLaMA-Factory's own answer to padding waste, which ODB replaces; packed sequences also
make a sample's tokens no longer one sample), streaming datasets, ASFT/DFT/EAFT losses
(their own normalisation), ``ignore_pad_token_for_loss: false`` (padding would count
as loss tokens), a ``per_device_train_batch_size`` (ODB's token budget sets the batch),
``do_eval``/``do_predict`` (this launcher trains and saves; evaluate the saved model with
``llamafactory-cli``), the callbacks it does not add (SwanLab, the profilers), the
hyper_parallel trainer, and multimodal models (the collator would need the model in ODB's
collate process).

This module imports llamafactory only when a recipe is run, so ``import odb`` and
``import odb.integrations`` stay free of it; llamafactory pins older transformers,
datasets, peft and accelerate than the artifact, so it lives in its own environment
(``make check-llamafactory``, ``requirements/llamafactory.txt``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from odb.loader import ODBLoader

__all__ = ["ODB_KEY", "check_recipe", "run_sft", "sft_trainer"]

# The recipe's section holding the ODBLoader options.
ODB_KEY = "odb"
# ODBLoader options the launcher takes from LLaMA-Factory -> from where.
_FROM_LLAMAFACTORY = {
    "grad_accum_steps": "the recipe's gradient_accumulation_steps (set that instead)",
    "ignore_index": "LLaMA-Factory's IGNORE_INDEX, its label padding",
}
# Recipe keys that cannot hold together with ODB batches: value that is refused -> reason.
_REFUSED: dict[str, tuple[Any, str]] = {
    "packing": (True, "LLaMA-Factory's packing concatenates samples; ODB forms the batches"),
    "neat_packing": (True, "neat_packing packs samples; ODB forms the batches (padding-aware)"),
    "streaming": (True, "a streamed dataset has no length; ODB groups a map-style dataset"),
    "use_asft_loss": (True, "ASFT computes its own loss, not ODB's exact per-token mean"),
    "use_dft_loss": (True, "DFT's loss is not checked against ODB's normaliser"),
    "use_eaft_loss": (True, "EAFT's loss is not checked against ODB's normaliser"),
    "ignore_pad_token_for_loss": (False, "padding labels would count as loss tokens"),
    "do_eval": (True, "the launcher trains; evaluate the saved model with llamafactory-cli"),
    "do_predict": (True, "the launcher trains; predict with llamafactory-cli on the saved model"),
    "use_hyper_parallel": (True, "hyper_parallel brings its own SFT trainer"),
    "use_swanlab": (True, "the launcher adds no SwanLab callback; use report_to"),
    "enable_torch_profiler": (True, "the launcher adds no profiler callback"),
    "profile_modules": (True, "the launcher adds no module profiler callback"),
}


def check_recipe(recipe: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a recipe into LLaMA-Factory's arguments and the ODBLoader options; refuse
    what cannot run with ODB batches.

    ``ignore_data_skip`` is set to true where the recipe does not give it (the loader
    resumes from its own state; ``ODBTrainer`` refuses an explicit false).

    Returns:
        ``(llamafactory_args, odb_options)``.

    Raises:
        ValueError: Not an SFT training recipe, no ``odb:`` mapping with a
            ``token_budget``, ``grad_accum_steps`` or ``ignore_index`` in ``odb:``, a
            batch size, or a setting of ``_REFUSED`` (named, with the reason and what to
            change).

    Example:
        >>> args, options = check_recipe({"stage": "sft", "do_train": True,
        ...                               "odb": {"token_budget": 512}})
        >>> options, args["ignore_data_skip"]
        ({'token_budget': 512}, True)
    """
    args = dict(recipe)
    options = args.pop(ODB_KEY, None)
    if args.get("stage") != "sft" or not args.get("do_train"):
        raise ValueError(
            f"stage={args.get('stage')!r}, do_train={args.get('do_train')!r}: ODB runs "
            "LLaMA-Factory's SFT training; set stage: sft and do_train: true"
        )
    if not isinstance(options, Mapping) or "token_budget" not in options:
        raise ValueError(
            f"the recipe needs an '{ODB_KEY}:' section with the ODBLoader options, at least "
            f"token_budget (got {options!r}), e.g. {ODB_KEY}: {{token_budget: 4096}}"
        )
    for key, source in _FROM_LLAMAFACTORY.items():
        if key in options:
            raise ValueError(f"{ODB_KEY}.{key}: the loader takes {source}; remove it")
    if "per_device_train_batch_size" in args:
        raise ValueError(
            f"per_device_train_batch_size={args['per_device_train_batch_size']}: ODB's "
            f"token budget sets each batch; remove it and set {ODB_KEY}.token_budget"
        )
    for key, (refused, reason) in _REFUSED.items():
        if key in args and bool(args[key]) == refused:
            raise ValueError(f"{key}={args[key]!r} cannot run with ODB: {reason}; remove it")
    args.setdefault("ignore_data_skip", True)
    return args, dict(options)


def sft_trainer(recipe: Mapping[str, Any], callbacks: Sequence[Any] = ()) -> Any:
    """LLaMA-Factory's SFT set-up for ``recipe``, returned as a trainer fed by ODB.

    Args:
        recipe: A LLaMA-Factory SFT recipe with an ``odb:`` section (:func:`check_recipe`).
        callbacks: ``transformers.TrainerCallback`` objects to add.

    Returns:
        A ``CustomSeq2SeqTrainer`` with ``ODBTrainer`` first in its method order; its
        ``train_loader`` is the ODB loader over LLaMA-Factory's tokenised train split.

    Raises:
        ValueError: See :func:`check_recipe`; also a multimodal model (a processor).
    """
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.extras.constants import IGNORE_INDEX
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    args, options = check_recipe(recipe)
    model_args, data_args, training_args, finetuning_args, generating_args = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)
    if tokenizer_module.get("processor") is not None:
        raise ValueError(
            f"{model_args.model_name_or_path} is multimodal (it has a processor); ODB's "
            "LLaMA-Factory launcher trains text models only"
        )
    tokenizer = tokenizer_module["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    dataset_module = get_dataset(
        template, model_args, data_args, training_args, stage="sft", **tokenizer_module
    )
    model = load_model(tokenizer, model_args, finetuning_args, training_args.do_train)
    collator = _collator(template, model, model_args, tokenizer_module)
    loader = ODBLoader(
        dataset_module["train_dataset"],
        collate_fn=collator,
        grad_accum_steps=training_args.gradient_accumulation_steps,
        ignore_index=IGNORE_INDEX,
        **options,
    )
    return _trainer_class()(
        model=model,
        args=training_args,
        finetuning_args=finetuning_args,
        data_collator=collator,  # evaluation batches; ODB collates training batches
        callbacks=_callbacks(model_args, data_args, finetuning_args, generating_args, callbacks),
        eval_dataset=dataset_module.get("eval_dataset"),
        train_loader=loader,
        **tokenizer_module,
    )


def _callbacks(
    model_args: Any, data_args: Any, finetuning_args: Any, generating_args: Any, extra: Sequence
) -> list[Any]:
    """The callbacks LLaMA-Factory's ``run_exp`` gives ``run_sft`` (its log file
    ``trainer_log.jsonl``, its total following the loader, PiSSA conversion, early
    stopping, the reporter last), plus ``extra``."""
    from llamafactory.train.callbacks import LogCallback, PissaConvertCallback, ReporterCallback
    from transformers import EarlyStoppingCallback

    callbacks = [_log_callback(LogCallback), *extra]
    if finetuning_args.pissa_convert:
        callbacks.append(PissaConvertCallback())
    if finetuning_args.early_stopping_steps is not None:
        patience = finetuning_args.early_stopping_steps
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=patience))
    return [*callbacks, ReporterCallback(model_args, data_args, finetuning_args, generating_args)]


def _log_callback(log_callback: type) -> Any:
    """LLaMA-Factory's ``LogCallback`` (``trainer_log.jsonl``, the web UI's progress) with
    its step total read from ``state.max_steps`` at every log, not only at the start:
    ``ODBTrainer`` keeps that at the loader's estimate, exact when the last epoch ends, so
    the log's ``percentage`` ends at 100 (the start's total is an upper bound)."""

    class EstimatedLogCallback(log_callback):
        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.max_steps = state.max_steps
            super().on_log(args, state, control, **kwargs)

    return EstimatedLogCallback()


def _collator(template: Any, model: Any, model_args: Any, tokenizer_module: dict) -> Any:
    """LLaMA-Factory's SFT collator as its ``run_sft`` builds it for training."""
    from llamafactory.data import SFTDataCollatorWith4DAttentionMask
    from llamafactory.extras.constants import IGNORE_INDEX

    return SFTDataCollatorWith4DAttentionMask(
        template=template,
        model=None,  # used only for multimodal rope indices; multimodal models are refused
        pad_to_multiple_of=8,
        label_pad_token_id=IGNORE_INDEX,  # ignore_pad_token_for_loss: false is refused
        block_diag_attn=model_args.block_diag_attn,
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        compute_dtype=model_args.compute_dtype,
        **tokenizer_module,
    )


def run_sft(trainer: Any) -> Any:
    """Train and save as LLaMA-Factory's ``run_sft`` does (the model, metrics, state and
    the loss plot), for a trainer from :func:`sft_trainer`. Returns the train result."""
    result = trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    if trainer.is_world_process_zero() and trainer.finetuning_args.plot_loss:
        from llamafactory.extras.ploting import plot_loss

        plot_loss(trainer.args.output_dir, keys=["loss"])
    return result


def _trainer_class() -> type:
    """``ODBTrainer`` before LLaMA-Factory's ``CustomSeq2SeqTrainer`` (built on first use,
    so this module imports llamafactory only when a recipe runs)."""
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

    from odb.integrations.hf_trainer import ODBTrainer

    return type("ODBSeq2SeqTrainer", (ODBTrainer, CustomSeq2SeqTrainer), {})


def main(argv: list[str] | None = None) -> None:
    """``python -m odb.integrations.llamafactory recipe.yaml``."""
    import torch.distributed as dist
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path, help="LLaMA-Factory SFT YAML with an odb: section")
    recipe = yaml.safe_load(parser.parse_args(argv).recipe.read_text())
    run_sft(sft_trainer(recipe))
    if dist.is_initialized():  # leave the group before interpreter teardown
        dist.destroy_process_group()


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
