import os
import sys

# The tests share helpers.py beside them.
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

# One intra-op thread: these tests compare results, not speed, and the machines they run
# on are small and shared (PyTorch's thread pool spins against other work). Every
# comparison runs both modules under the same setting. The kernels would follow it and
# run every call on its calling thread; here they keep the crate's pool instead
# (EMBEDDING_KERNELS_OPENMP=0, read at the first call), so that the tests in this
# process cover the pool. The fresh interpreters some tests start do not inherit it
# (test_forward._run): PyTorch's team and its thread count are tested there.
torch.set_num_threads(1)
os.environ["EMBEDDING_KERNELS_OPENMP"] = "0"
