"""Test setup: never wait on the network, keep torch small and deterministic."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tiny ops: one thread is faster and immune to a busy neighbour


@pytest.fixture(autouse=True)
def _seed():
    from posenc_lib import set_seed

    set_seed(0)
    yield
