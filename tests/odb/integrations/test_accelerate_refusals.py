"""``odb.integrations.accelerate`` refuses the distributed types whose gradient handling
would change ODB's exact loss, naming the helper that drives them: an FSDP plugin and
DeepSpeed. Accelerate enables FSDP on accelerators only (on CPU it falls back to
MULTI_CPU), so the refusal is checked on the distributed type itself."""

from __future__ import annotations

import pytest

from odb.integrations.accelerate import check_distributed_type


def test_an_fsdp_plugin_is_refused_naming_the_fsdp_helper() -> None:
    from accelerate.utils import DistributedType

    with pytest.raises(ValueError, match=r"FSDP .* odb\.integrations\.fsdp"):
        check_distributed_type(DistributedType.FSDP)
    with pytest.raises(ValueError, match=r"DEEPSPEED .* odb\.integrations\.deepspeed"):
        check_distributed_type(DistributedType.DEEPSPEED)
    check_distributed_type(DistributedType.MULTI_CPU)  # driven: no error
    check_distributed_type(DistributedType.NO)

