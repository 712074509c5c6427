import os

import pytest
import torch

# The suite never reaches the Hugging Face Hub: model ids outside the registry are read from
# the cache (tests build one) or refused at once, in this process and in the CLI's children.
os.environ["HF_HUB_OFFLINE"] = "1"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
