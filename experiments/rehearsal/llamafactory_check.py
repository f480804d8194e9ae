"""LLaMA-Factory's SFT stage with ODB at W=2 on CPU trains every sample exactly once.

    make check-llamafactory                                  # venv, then this check
    .venv-llamafactory/bin/python experiments/rehearsal/llamafactory_check.py --out DIR

Hub-free: it builds a tiny Qwen3 and a byte-level BPE tokenizer (the artifact's
``experiments.data.assets.train_tokenizer``) in ``DIR/model``, an alpaca-format dataset
of ``--samples`` records with its ``dataset_info.json`` in ``DIR/data``, and the
example's recipe (``examples/llamafactory/recipe.yaml``) with those paths. Then
``torchrun --nproc_per_node 2`` runs this file with ``--rank``: LLaMA-Factory's data
preparation and trainer through :mod:`odb.integrations.llamafactory`, each rank writing
the dataset indices of every batch it trained to ``DIR/ids/rank{r}.json``. Exits
non-zero unless the two ranks together trained each index of LLaMA-Factory's tokenised
dataset exactly once, that dataset holds every record, and LLaMA-Factory's
``trainer_log.jsonl`` ends at 100 %.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "llamafactory" / "recipe.yaml"
WORDS = "the a model token batch rank budget sample loss step data pad window group".split()


def build_assets(out: Path, samples: int, seed: int = 0) -> Path:
    """Tiny model, tokenizer, dataset and recipe under ``out``; returns the recipe path."""
    sys.path.insert(0, str(ROOT))  # the artifact's experiments package (not installed)
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from experiments.data.assets import train_tokenizer

    rng = random.Random(seed)
    records = [
        {
            "instruction": " ".join(rng.choices(WORDS, k=rng.randint(3, 40))),
            "input": "",
            "output": " ".join(rng.choices(WORDS, k=rng.randint(2, 60))),
        }
        for _ in range(samples)
    ]
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "tiny_sft.json").write_text(json.dumps(records))
    info = {"tiny_sft": {"file_name": "tiny_sft.json"}}  # LLaMA-Factory's dataset_info.json
    (data / "dataset_info.json").write_text(json.dumps(info))
    texts = [r["instruction"] + " " + r["output"] for r in records]
    tokenizer = train_tokenizer(iter(texts * 4), out / "model", vocab_size=400)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(out / "model")
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe.update(model_name_or_path=str(out / "model"), dataset_dir=str(data))
    recipe.update(output_dir=str(out / "train"))
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def train_rank(out: Path) -> None:
    """One rank (under torchrun): train the recipe, record each trained batch's indices."""
    import torch.distributed as dist
    from transformers import TrainerCallback

    from odb.integrations.llamafactory import run_sft, sft_trainer

    class Recorder(TrainerCallback):
        def __init__(self) -> None:
            self.ids: list[int] = []

        def on_step_end(self, args, state, control, **kwargs) -> None:  # noqa: ANN001
            self.ids += [i for info in trainer.window_infos for i in info.sample_ids]

    recorder = Recorder()
    trainer = sft_trainer(yaml.safe_load((out / "recipe.yaml").read_text()), [recorder])
    run_sft(trainer)
    rank = dist.get_rank() if dist.is_initialized() else 0
    (out / "ids").mkdir(exist_ok=True)
    record = {"ids": recorder.ids, "dataset": len(trainer.train_loader.dataset)}
    (out / "ids" / f"rank{rank}.json").write_text(json.dumps(record))
    if dist.is_initialized():
        dist.destroy_process_group()


def check(out: Path, samples: int, timeout: float) -> list[str]:
    """Build, train at W=2, and return what is wrong (empty: every sample once)."""
    sys.path.insert(0, str(ROOT))
    from harness.torchrun import run_torchrun

    build_assets(out, samples)
    shutil.rmtree(out / "ids", ignore_errors=True)  # never judge an earlier run's record
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    code, stdout, stderr = run_torchrun(__file__, 2, ["--rank", "--out", str(out)], timeout, env)
    if code != 0:
        return [f"torchrun exited {code}:\n{stdout[-2000:]}\n{stderr[-6000:]}"]
    ranks = [json.loads((out / "ids" / f"rank{r}.json").read_text()) for r in (0, 1)]
    counts = Counter(i for rank in ranks for i in rank["ids"])
    problems = []
    if ranks[0]["dataset"] != samples:
        problems.append(f"LLaMA-Factory's dataset holds {ranks[0]['dataset']} of {samples} records")
    missing = sorted(set(range(ranks[0]["dataset"])) - set(counts))
    repeated = sorted(i for i, n in counts.items() if n > 1)
    if missing or repeated:
        problems.append(f"samples never trained: {missing}; trained more than once: {repeated}")
    if not all(rank["ids"] for rank in ranks):
        problems.append(f"a rank trained nothing: {[len(rank['ids']) for rank in ranks]}")
    return problems + _progress_problems(out / "train" / "trainer_log.jsonl")


def _progress_problems(log: Path) -> list[str]:
    """LLaMA-Factory's ``trainer_log.jsonl`` (logging_steps 1) ends at its step total."""
    if not log.exists():
        return [f"no {log}: LLaMA-Factory's log callback wrote nothing"]
    last = json.loads(log.read_text().splitlines()[-1])
    if last["current_steps"] != last["total_steps"]:
        return [f"the log ends at step {last['current_steps']} of {last['total_steps']}"]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "check-llamafactory")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for torchrun")
    parser.add_argument("--rank", action="store_true", help="(internal) one torchrun rank")
    args = parser.parse_args()
    if args.rank:
        return train_rank(args.out)
    problems = check(args.out.resolve(), args.samples, args.timeout)
    if problems:
        sys.exit("check-llamafactory FAILED:\n" + "\n".join(problems))
    print(f"check-llamafactory passed: {args.samples} samples, each trained once at W=2")


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
