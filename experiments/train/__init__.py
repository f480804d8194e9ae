"""The train entry point: any method x {full, LoRA} x {DDP, DeepSpeed ZeRO} on Qwen3-VL.

``python -m experiments.train --config LAYER.yaml [--config ...] [key=value ...]`` under
``torchrun``; see `experiments.train.run` for the commands at each scale and
``experiments/configs/`` for the layers. Modules: `config` (the validated config),
`model` (build, freeze, LoRA), `strategy` (DDP / DeepSpeed over ``odb.integrations``
windows), `schedule` (the progress-driven learning rate), `loop` (windows of
micro-steps), `curves` (TensorBoard training curves), `checkpoint`, `result` (the result
JSON).
"""
