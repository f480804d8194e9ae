"""Per-epoch sampler views: which dataset indices each rank reads.

Like ``DistributedSampler`` but without padding duplicates: the seeded permutation
(``seed + epoch``) is dealt round-robin, so views differ in size by at most one and
their union is every index exactly once. Every rank computes the same permutation.
"""

from __future__ import annotations

import torch


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's global order of dataset indices."""
    if not shuffle:
        return list(range(num_samples))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


def rank_view(
    num_samples: int, rank: int, world_size: int, *, seed: int, epoch: int, shuffle: bool
) -> list[int]:
    """Indices rank ``rank`` reads this epoch, in reading order.

    Example:
        >>> rank_view(5, 1, 2, seed=0, epoch=0, shuffle=False)
        [1, 3]
    """
    if not 0 <= rank < world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]"
        )
    return epoch_order(num_samples, seed, epoch, shuffle)[rank::world_size]
