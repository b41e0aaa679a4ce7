"""One node over N processes: torchrun + FSDP2 (torch.distributed).

    torchrun --nproc_per_node 8 neurons/miner.py ...      # one node, 8 ranks (GPUs)
    python neurons/miner.py ...                           # one process: the same role loop on
                                                          # `runtime.compute.LocalCompute`

Modules, one idea each:
  group       process group from torchrun's environment (gloo on CPU, nccl on CUDA), timeouts,
              rank-0-only I/O with broadcast of what the other ranks need
  fsdp        `fully_shard` per transformer block, then the root; where each rank's rows are
  train       each rank trains on its share of the node's pages; the reduced gradient is the
              1-process gradient of all the pages
  demo        DeMo error feedback split across ranks by parameter; the gathered payload is the
              1-process payload
  outer       the signed top-G aggregate applied to the sharded parameters; probes
  checkpoint  the node's own state as the one safetensors file any rank count can load
  compute     `NodeCompute`: the node's ops (`runtime.compute.Compute`) run by all ranks, rank 0 driving
  launch      what `neurons/*.py` run: one process, or rank 0 / a follower under torchrun
  sizing      per-GPU memory of a LLaMA shape at N ranks, computed on the meta device
"""

from templar.distributed.checkpoint import load_sharded_state, save_sharded_state
from templar.distributed.demo import ShardedDeMo, assign_owners
from templar.distributed.fsdp import local_rows, shard_model
from templar.distributed.group import DistError, Group, init_group
from templar.distributed.outer import collect_probes_sharded, outer_step_sharded
from templar.distributed.train import accumulate_sharded, rank_share

__all__ = [
    "DistError",
    "Group",
    "ShardedDeMo",
    "accumulate_sharded",
    "assign_owners",
    "collect_probes_sharded",
    "init_group",
    "load_sharded_state",
    "local_rows",
    "outer_step_sharded",
    "rank_share",
    "save_sharded_state",
    "shard_model",
]
