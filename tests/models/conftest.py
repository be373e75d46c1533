"""Fixtures of the model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def single_intra_op_thread():
    """Run a module's small models on one thread (``pytestmark = pytest.mark.usefixtures(...)``):
    on a shared CPU, several intra-op threads per tiny matmul cost far more in synchronisation
    than they gain."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
