"""A training script without an ``if __name__ == "__main__":`` guard (launched by torchrun).

Top-level scripts like this are common. A spawned collate process
(``sys.argv[1:] == ["process", "spawn"]``) would re-run this file; ODB must refuse at
once, naming the guard. A forked one (``["process", "fork"]``) and thread
mode (``["thread"]``) train normally.
"""

import sys

import torch.distributed as dist

import odb
from harness.scenarios import LengthDataset

dist.init_process_group("gloo")
loader = odb.ODBLoader(
    LengthDataset([(i * 7) % 60 + 1 for i in range(40)]),
    token_budget=128,
    collate_mode=sys.argv[1],
    collate_start_method=sys.argv[2] if len(sys.argv) > 2 else None,
    align_timeout_s=60.0,
)
ids = [i for batch in loader for i in odb.pop_step_info(batch).sample_ids]
print(f"RESULT {dist.get_rank()} {len(ids)}", flush=True)
dist.destroy_process_group()
