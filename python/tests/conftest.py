import os
import sys

# The tests share helpers.py beside them.
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

# One intra-op thread: these tests compare results, not speed, and the machines they run
# on are small and shared (PyTorch's thread pool spins against other work). Every
# comparison runs both modules under the same setting. The kernels follow it: once a
# large call has found PyTorch's libgomp, they run on the calling thread alone; the
# tests of the crate's pool and of PyTorch's team run in fresh interpreters.
torch.set_num_threads(1)
