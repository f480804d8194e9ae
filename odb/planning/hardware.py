"""Tables of GPUs and parallel strategies for the step-cost model, every number sourced.

A :class:`Gpu` holds what a training step's time depends on: the dense bf16 peak (the
tensor-core figure without sparsity), memory and its bandwidth, the NVLink bandwidth
between GPUs of a node and the network bandwidth per GPU between nodes. Each number's
source is in ``sources`` under the field's name (a test fails on a number without one).
Bandwidths are per direction: a vendor's "900 GB/s NVLink" is the bidirectional total,
450 GB/s each way, which is what a ring collective's step moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

_H100_SHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet, SXM column (nvidia.com/en-us/data-center/h100)"
)
_H200_SHEET = (
    "NVIDIA H200 Tensor Core GPU datasheet, SXM column (nvidia.com/en-us/data-center/h200)"
)
_A100_SHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column (nvidia.com/content/dam/"
    "en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
)
_H20_SHEET = (
    "NVIDIA HGX H20 product brief (2024; distributed to partners, not on nvidia.com's "
    "public pages): 148 TFLOPS dense BF16, 96 GB HBM3, 4.0 TB/s, NVLink 900 GB/s"
)
_NVLINK4 = "half of the datasheet's 900 GB/s NVLink (bidirectional total): 450 GB/s per direction"
_CX7 = (
    "one 400 Gb/s ConnectX-7 port per GPU = 50 GB/s: the DGX H100/H200 reference design "
    "(NVIDIA DGX H100/H200 datasheet, 8x single-port ConnectX-7 for the compute fabric)"
)


@dataclass(frozen=True)
class Gpu:
    """One GPU model's figures (SI units: TFLOP/s, GB, GB/s), each with its source."""

    name: str
    bf16_tflops: float
    memory_gb: float
    hbm_gbps: float
    nvlink_gbps: float
    internode_gbps: float
    sources: Mapping[str, str]

    def __post_init__(self) -> None:
        for f in numeric_fields(self):
            if not getattr(self, f) > 0:
                raise ValueError(f"Gpu {self.name}: {f} must be > 0, got {getattr(self, f)}")


def numeric_fields(obj: object) -> list[str]:
    """The names of ``obj``'s int/float dataclass fields (those a source must back)."""
    return [f.name for f in fields(obj) if isinstance(getattr(obj, f.name), (int, float))  # type: ignore[arg-type]
            and not isinstance(getattr(obj, f.name), bool)]  # fmt: skip


GPUS: dict[str, Gpu] = {
    "a100": Gpu(
        "A100-SXM4-80GB",
        312.0,
        80.0,
        2039.0,
        300.0,
        25.0,
        {
            "bf16_tflops": _A100_SHEET + ": BF16 Tensor Core 312 TFLOPS (624 with sparsity)",
            "memory_gb": _A100_SHEET + ": 80GB HBM2e",
            "hbm_gbps": _A100_SHEET + ": 2,039 GB/s",
            "nvlink_gbps": "half of the datasheet's 600 GB/s NVLink (bidirectional total)",
            "internode_gbps": "one 200 Gb/s HDR port per GPU = 25 GB/s: NVIDIA DGX A100 datasheet "
            "(8x single-port ConnectX-6 for the compute fabric)",
        },
    ),
    "h100": Gpu(
        "H100-SXM5-80GB",
        989.0,
        80.0,
        3350.0,
        450.0,
        50.0,
        {
            "bf16_tflops": _H100_SHEET + ": BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense",
            "memory_gb": _H100_SHEET + ": 80GB",
            "hbm_gbps": _H100_SHEET + ": 3.35 TB/s",
            "nvlink_gbps": _NVLINK4,
            "internode_gbps": _CX7,
        },
    ),
    "h200": Gpu(
        "H200-SXM-141GB",
        989.0,
        141.0,
        4800.0,
        450.0,
        50.0,
        {
            "bf16_tflops": _H200_SHEET + ": BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense",
            "memory_gb": _H200_SHEET + ": 141GB HBM3e",
            "hbm_gbps": _H200_SHEET + ": 4.8 TB/s",
            "nvlink_gbps": _NVLINK4,
            "internode_gbps": _CX7,
        },
    ),
    "h20": Gpu(
        "H20-96GB",
        148.0,
        96.0,
        4000.0,
        450.0,
        50.0,
        {
            "bf16_tflops": _H20_SHEET,
            "memory_gb": _H20_SHEET,
            "hbm_gbps": _H20_SHEET,
            "nvlink_gbps": _NVLINK4 + " (the H20 brief's 900 GB/s)",
            "internode_gbps": _CX7 + "; the paper does not name its network",
        },
    ),
}

# What a strategy moves per step, per GPU, in units of a (bf16) parameter set: the ring
# all-reduce moves 2 (W-1)/W of the gradients; reduce-scatter and all-gather (W-1)/W each.
# ZeRO-2 (DeepSpeed, Rajbhandari et al. 2020, Sec. 5.2 / 7.1): reduce-scatter of the
# gradients + all-gather of the updated parameters = DDP's volume. FSDP / ZeRO-3 (Sec.
# 7.2): all-gather in forward and again in backward + reduce-scatter = 1.5x DDP's.
STRATEGIES: dict[str, dict[str, float]] = {
    "ddp": {"grad_passes": 2.0, "param_passes": 0.0, "optimizer_shard": 0.0},
    "zero2": {"grad_passes": 1.0, "param_passes": 1.0, "optimizer_shard": 1.0},
    "fsdp": {"grad_passes": 1.0, "param_passes": 2.0, "optimizer_shard": 1.0},
}
STRATEGY_SOURCE = (
    "ZeRO (Rajbhandari et al., SC 2020, arXiv:1910.02054) Sec. 7: DDP and "
    "ZeRO-2 move 2 parameter sets per step, ZeRO-3/FSDP 3; ring volumes "
    "(W-1)/W per pass (Patarasuk & Yuan 2009)"
)
# Bytes per parameter the optimizer step reads and writes (mixed-precision AdamW: fp32
# master weights, momentum and variance read and written, the bf16 gradient read and the
# bf16 weight written): 3 x 4 x 2 + 2 + 2 = 28 (ZeRO paper Sec. 3.1: 16 bytes of state).
OPTIMIZER_BYTES_PER_PARAM = 28
OPTIMIZER_BYTES_SOURCE = "ZeRO Sec. 3.1: mixed-precision Adam keeps 12 bytes of fp32 state + 2 + 2"


def gpu(name: str) -> Gpu:
    """The table's GPU ``name`` (case-insensitive), or an error naming the choices."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; choose one of {sorted(GPUS)}")
    return GPUS[key]


def strategy(name: str) -> dict[str, float]:
    """The communication passes of strategy ``name`` (ddp, zero2, fsdp)."""
    key = name.lower().replace("-", "").replace("_", "")
    key = {"deepspeedzero2": "zero2", "fsdp2": "fsdp", "zero3": "fsdp"}.get(key, key)
    if key not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[key]
