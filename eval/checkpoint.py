"""Load what the train entry point writes (or a base model) for evaluation.

A checkpoint folder (``<run_dir>/final/``, ``<run_dir>/checkpoints/step_000010/``) holds
``trainer_state.json`` (``run_id``, ``global_step``) and one of

- ``model/``: full fine-tuning, ``save_pretrained`` of the Qwen3-VL model with the
  tokenizer and image-processor files in the same folder;
- ``adapter/``: LoRA, peft ``save_pretrained`` with the tokenizer/processor files
  alongside; ``adapter_config.json``'s ``base_model_name_or_path`` names the base.

`load_checkpoint` also takes a ``model/`` or ``adapter/`` folder directly, a plain HF
model folder, or a hub id (the untrained base, on the cluster). LoRA weights are merged
into the base by default, so every evaluator (and lm-eval's ``HFLM``, which wants a
``PreTrainedModel``) sees one plain model; the merged forward equals the wrapped one up
to float rounding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

MODEL_TYPE = "qwen3_vl"
_TRAINER_STATE = "trainer_state.json"


@dataclass(frozen=True)
class CheckpointMeta:
    """Where a loaded model came from, for result JSON.

    Attributes:
        path: the ``--checkpoint`` argument as given.
        kind: ``"full"`` (a model folder or hub id) or ``"lora"`` (an adapter over a base).
        model: folder (or hub id) the weights were read from.
        base_model: the LoRA base (None for ``full``).
        processor: folder (or hub id) the tokenizer and image processor were read from.
        run_id / global_step: from ``trainer_state.json`` when there is one.
    """

    path: str
    kind: str
    model: str
    base_model: str | None = None
    processor: str | None = None
    run_id: str | None = None
    global_step: int | None = None

    def as_record(self) -> dict:
        return {
            "path": self.path,
            "kind": self.kind,
            "model": self.model,
            "base_model": self.base_model,
            "processor": self.processor,
            "run_id": self.run_id,
            "global_step": self.global_step,
        }


def _is_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def resolve(path: str | Path) -> tuple[str, Path | str, Path | None]:
    """(kind, weights folder or hub id, folder holding trainer_state.json or None).

    Raises:
        FileNotFoundError: ``path`` is neither a checkpoint layout nor a hub id.
    """
    name = str(path)
    p = Path(name).expanduser()
    if not p.exists():
        if _is_hub_id(name):
            return "full", name, None
        raise FileNotFoundError(
            f"Checkpoint {name!r} does not exist; pass a checkpoint folder (with model/ or "
            f"adapter/ and trainer_state.json), a model/ or adapter/ folder, a HF model "
            f"folder, or a hub id such as Qwen/Qwen3-VL-2B-Instruct"
        )
    for sub, kind in (("model", "full"), ("adapter", "lora")):
        if (p / sub).is_dir():
            return kind, p / sub, p
    state_dir = p.parent if (p.parent / _TRAINER_STATE).exists() else None
    if (p / "adapter_config.json").exists():
        return "lora", p, state_dir
    if (p / "config.json").exists():
        return "full", p, state_dir
    raise FileNotFoundError(
        f"Checkpoint folder {p} has none of model/, adapter/, config.json or "
        f"adapter_config.json (it holds: {sorted(x.name for x in p.iterdir())[:10]}); point "
        f"--checkpoint at a folder the train entry point wrote (e.g. <run_dir>/final)"
    )


def _check_model_type(source: Path | str) -> None:
    from transformers import AutoConfig

    model_type = AutoConfig.from_pretrained(source).model_type
    if model_type != MODEL_TYPE:
        raise ValueError(
            f"Checkpoint {source} holds a {model_type!r} model; these evaluators "
            f"score {MODEL_TYPE!r} (Qwen3VLForConditionalGeneration) models"
        )


def _trainer_state(state_dir: Path | None) -> dict:
    if state_dir is None or not (state_dir / _TRAINER_STATE).exists():
        return {}
    return json.loads((state_dir / _TRAINER_STATE).read_text())


def training_config(path: str | Path) -> dict:
    """The config the run trained with (``trainer_state.json``'s ``config``).

    Raises:
        FileNotFoundError: the checkpoint has no ``trainer_state.json`` with a config
            (a plain HF folder, a hub id, or a folder not written by the train entry point).
    """
    _, _, state_dir = resolve(path)
    config = _trainer_state(state_dir).get("config")
    if not config:
        raise FileNotFoundError(
            f"{path} has no trainer_state.json with the run's config (written by "
            "python -m experiments.train); pass the data settings explicitly instead"
        )
    return config


def load_checkpoint(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    merge_lora: bool = True,
):
    """Load a checkpoint for evaluation: ``(model, tokenizer, image_processor, meta)``.

    Args:
        path: checkpoint folder, ``model/`` / ``adapter/`` folder, HF folder or hub id.
        dtype: parameter dtype (float32 on CPU, bfloat16 on GPU).
        device: where the model goes.
        merge_lora: merge LoRA weights into the base (True) or return the peft wrapper.

    Returns:
        The model in eval mode, its tokenizer, its Qwen-VL image processor and a
        `CheckpointMeta`.

    Raises:
        FileNotFoundError: the checkpoint does not exist or has no known layout.
        ValueError: the checkpoint (or a LoRA adapter's base) is not a Qwen3-VL model,
            or a LoRA adapter names no base.

    Example:
        >>> model, tok, ip, meta = load_checkpoint("runs/x/final")  # doctest: +SKIP
        >>> meta.kind, meta.run_id  # doctest: +SKIP
        ('lora', 'mmmix-odb-lora-s0')
    """
    kind, source, state_dir = resolve(path)
    base = _lora_base(source) if kind == "lora" else None
    _check_model_type(base or source)
    model = _load_model(source, base, dtype=dtype, device=device, merge_lora=merge_lora)
    # The tokenizer and processor files sit next to the weights (or in the base folder).
    files = source if _has_tokenizer(source) else (base or source)
    tokenizer, image_processor = _load_processors(files)
    state = _trainer_state(state_dir)
    meta = CheckpointMeta(
        path=str(path),
        kind=kind,
        model=str(source),
        base_model=base,
        processor=str(files),
        run_id=state.get("run_id"),
        global_step=state.get("global_step"),
    )
    return model, tokenizer, image_processor, meta


def _lora_base(adapter: Path | str) -> str:
    """The base model a LoRA adapter folder names (``adapter_config.json``'s
    ``base_model_name_or_path``).

    Raises:
        ValueError: the adapter config names no base.
    """
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{adapter}/adapter_config.json names no base_model_name_or_path; "
            f"re-save the adapter with peft so the base is recorded"
        )
    return base


def _load_model(
    source: Path | str,
    base: str | None,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    merge_lora: bool,
):
    """The Qwen3-VL model in eval mode on ``device``.

    ``base`` None: the weights of ``source``. Otherwise ``source`` is a LoRA adapter over
    ``base``: the base is loaded, the adapter applied and, with ``merge_lora``, merged
    (a plain model); without it the peft wrapper is returned.
    """
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(base or source, dtype=dtype)
    if base is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, source)
        if merge_lora:
            model = model.merge_and_unload()
    model.to(device).eval()
    return model


def _load_processors(files: Path | str):
    """``(tokenizer, image_processor)`` read from ``files`` (a folder or hub id); the
    tokenizer gets the processor's chat template when it has none of its own."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(files)
    _attach_chat_template(tokenizer, files)
    return tokenizer, Qwen2VLImageProcessorPil.from_pretrained(files)


def _has_tokenizer(source: Path | str) -> bool:
    p = Path(source)
    return p.is_dir() and any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))


def _attach_chat_template(tokenizer, files: Path | str) -> None:
    """Use the processor's ``chat_template.jinja`` / ``chat_template.json`` when the
    tokenizer has no template (Qwen-VL checkpoints keep it with the processor)."""
    if tokenizer.chat_template is not None or not Path(files).is_dir():
        return
    jinja, js = Path(files) / "chat_template.jinja", Path(files) / "chat_template.json"
    if jinja.exists():
        tokenizer.chat_template = jinja.read_text()
    elif js.exists():
        tokenizer.chat_template = json.loads(js.read_text())["chat_template"]
