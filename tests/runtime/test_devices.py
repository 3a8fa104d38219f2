"""allocate, Step and BlockTables run on every device present and refuse the same devices with the same SpecError
messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_plans import attention_plan

from graphkv.errors import SpecError
from graphkv.runtime import BlockTables, Step, allocate

CONSTRUCTORS = {"allocate": allocate, "Step": Step, "BlockTables": lambda plan, device: BlockTables(plan, device=device)}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
CUDA_MISSING = r"CUDA is not available here .*pass device='cpu'"


@pytest.mark.parametrize("device,text", [
    ("gpu", "device='gpu': is not a device torch knows"),
    ("meta", "device='meta': graphkv's runtime runs on cpu or cuda"),
    (True, "device=True: must be a device string"),
    (3.5, "device=3.5: must be a device string"),
    pytest.param("cuda", "device='cuda': " + CUDA_MISSING, marks=NO_CUDA),
    pytest.param("cuda:3", "device='cuda:3': " + CUDA_MISSING, marks=NO_CUDA),
])
@pytest.mark.parametrize("build", list(CONSTRUCTORS))
def test_unknown_devices_are_spec_errors(build, device, text):
    """A device torch does not know, one the runtime does not run on, a non-device and CUDA without CUDA: SpecError."""
    with pytest.raises(SpecError, match=text):
        CONSTRUCTORS[build](attention_plan(), device)


@pytest.mark.parametrize("build", list(CONSTRUCTORS))
def test_every_device_present_is_accepted(build, device):
    """allocate, Step and BlockTables build on each device present ("cpu", and "cuda" with a GPU) and keep it."""
    built = CONSTRUCTORS[build](attention_plan(), device)
    assert built.device.type == device


def test_block_tables_run_their_kernels_on_every_device_present(kernels, device):
    """BlockTables commits and gathers on each device present with torch or Triton (compiled or interpreted)."""
    tables = BlockTables(attention_plan(num_blocks=8, max_model_len=64), device=device, kernels=kernels)
    tables.append(1, [[7, 3]])
    tables.sync(np.array([1, 0]), 2)
    tables.commit()
    assert tables.tables[0].device.type == device and tables.input_tables[0].device.type == device
    assert tables.input_tables[0][:2].tolist() == [[7, 3, 0, 0], [0, 0, 0, 0]]
