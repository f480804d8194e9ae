"""``ODBSFTTrainer``: TRL's ``SFTTrainer`` trained from ODB batches, with the exact loss.

TRL's ``SFTTrainer`` prepares the dataset (tokenises it if needed, builds ``labels``
from its completion or assistant masks, truncates to ``max_length``) and owns the
collator, the loss (its fused LM head's token log-probabilities, summed and divided by
``num_items_in_batch``, then multiplied by the process count under
``average_tokens_across_devices`` as ``Trainer.compute_loss`` does) and its metrics.
:class:`ODBSFTTrainer` keeps all of that and changes only where the training batches
come from: after TRL's preparation it builds an ODB loader over the prepared dataset,
with TRL's own collator as the loader's ``collate_fn``, and trains through
:class:`~odb.integrations.hf_trainer.ODBTrainerMixin`, the code ``ODBTrainer`` runs:
token-budgeted batches of whole samples, the window's exact normaliser as the only loss
normalisation over ranks and accumulation steps, IDLE steps as zero-weight steps, the
progress-driven schedule and step total, per-rank loader state in every checkpoint for
an exactly-once resume.

Checked against trl 1.16.0 (``SFTTrainer.__init__`` / ``_prepare_dataset`` /
``compute_loss``) and transformers 5.24: TRL's ``compute_loss`` applies the same
process-count factor the mixin cancels in ``num_items_in_batch``. Importing this module
imports ``trl``; ``import odb`` and ``import odb.integrations`` do not.
"""

from __future__ import annotations

from typing import Any

from trl import SFTTrainer

from odb.core.config import ODBConfig
from odb.integrations.hf_trainer import ODBTrainerMixin
from odb.loader import ODBLoader

__all__ = ["ODBSFTTrainer"]

# TRL's collators and losses mark "no loss" with this label value.
_TRL_IGNORE_INDEX = -100


# TRL's _BaseTrainer sets loss_is_scaled_for_ga = None unannotated, so its type is None
# alone, narrower than the Trainer's bool | None that the mixin's True keeps to.
class ODBSFTTrainer(ODBTrainerMixin, SFTTrainer):  # type: ignore[misc]
    """TRL's ``SFTTrainer`` fed by an ODB loader over the dataset TRL prepared.

    Args:
        *args: ``SFTTrainer`` arguments (``model``, ``args``, ``data_collator``,
            ``train_dataset``, ...), as for ``SFTTrainer``.
        odb_config: The ODB loader's settings (``token_budget``, ``grad_accum_steps``
            equal to ``args.gradient_accumulation_steps``, ``num_workers``, ...). The
            loader is built on every rank after TRL's preparation (its construction is
            collective under ``torch.distributed``), reading ``self.train_dataset``.
        **kwargs: Other ``SFTTrainer`` keyword arguments. The collator (TRL's
            ``DataCollatorForLanguageModeling`` unless one is given) collates the
            loader's groups and evaluation batches alike.

    Attributes:
        train_loader: The ODB loader built over TRL's prepared dataset.
        window_infos: The step info of the window being trained (for callbacks).

    Raises:
        ValueError: A TRL setting that cannot hold together with ODB, named with what to
            change: ``packing=True`` (TRL concatenates samples into ``max_length`` rows
            before ODB could group them), ``padding_free=True`` (TRL's collator would
            flatten each ODB batch into one row; not supported here), an
            ``odb_config.ignore_index`` other than TRL's -100, a prepared dataset without
            ``input_ids`` (a vision dataset TRL processes on the fly), and every setting
            ``ODBTrainer`` refuses (``gradient_accumulation_steps``,
            ``ignore_data_skip=False``, ...).

    Example:
        >>> args = SFTConfig("out", gradient_accumulation_steps=2,          # doctest: +SKIP
        ...                  ignore_data_skip=True, num_train_epochs=1)
        >>> trainer = ODBSFTTrainer(model=model, args=args, train_dataset=tokenised,
        ...                         processing_class=tokenizer,
        ...                         odb_config=odb.ODBConfig(token_budget=4096,
        ...                                                  grad_accum_steps=2))
        >>> trainer.train()
    """

    def __init__(self, *args: Any, odb_config: ODBConfig, **kwargs: Any) -> None:
        _check_trl_settings(args[1] if len(args) > 1 else kwargs.get("args"), odb_config)
        super().__init__(*args, **kwargs)
        _check_prepared(self.train_dataset)
        loader = ODBLoader(self.train_dataset, collate_fn=self.data_collator, config=odb_config)
        self._attach_loader(loader)


def _check_trl_settings(args: Any, config: ODBConfig) -> None:
    """Refuse, before TRL prepares the dataset, what cannot hold together with ODB."""
    if getattr(args, "packing", False):
        raise ValueError(
            "SFTConfig(packing=True) concatenates samples into max_length rows before ODB "
            "could group them, so ODB's batches would be of packed rows, not samples. Set "
            "packing=False: ODB forms token-budgeted batches of whole samples itself "
            "(docs/integrations.md, 'TRL packing or ODB')"
        )
    if getattr(args, "padding_free", False):
        raise ValueError(
            "SFTConfig(padding_free=True) flattens each batch into one row (FlashAttention "
            "only); ODBSFTTrainer does not support it. Set padding_free=False: ODB's "
            "batches are padded per group of similar lengths"
        )
    if config.ignore_index != _TRL_IGNORE_INDEX:
        raise ValueError(
            f"odb_config.ignore_index={config.ignore_index}, but TRL's collator and loss mark "
            f"labels without loss with {_TRL_IGNORE_INDEX}; set ignore_index="
            f"{_TRL_IGNORE_INDEX}"
        )


def _check_prepared(dataset: Any) -> None:
    """The prepared dataset must hold token ids: ODB measures samples by them.

    A stream that does not declare its columns is checked by the loader at its first
    sample instead.
    """
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "input_ids" not in columns:
        raise ValueError(
            f"TRL's prepared train dataset has no 'input_ids' (columns: {columns}): a vision "
            "dataset, or skip_prepare_dataset on raw data, is processed on the fly, so ODB "
            "cannot measure its samples. Pass a dataset TRL tokenises (text, prompt-"
            "completion or conversational) or an already tokenised one"
        )
