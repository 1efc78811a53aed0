"""One intra-op torch thread in the test process while a module's tests run.

The tools' processes already get one (``conftest.cli_env``: ``OMP_NUM_THREADS=1``) and
``inprocess.run_in_process`` sets one for its calls; what a test computes itself (models built
and run here, ``fairseq_cli.<tool>.main`` called directly) runs on torch's default, one thread
per core. On the suite's two cores, shared by two pytest workers and the processes they start,
two threads of tiny-model work spin waiting for each other: measured 20-60x slower (a 48-layer
forward and backward, 37 s instead of 1 s). The numbers are the ones the tools' processes
compute (one thread there too).

A module uses it by importing the fixture (autouse)::

    from one_thread import one_torch_thread  # noqa: F401  (autouse: one intra-op thread here)
"""

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
