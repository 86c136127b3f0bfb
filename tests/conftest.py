import atexit
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, torch.get_num_threads()))

# `recap generate` keeps a memory file per model in the user's cache by default: tests never touch the real one
_cache = tempfile.mkdtemp(prefix="recap-test-cache-")
os.environ["RECAP_CACHE"] = _cache
atexit.register(shutil.rmtree, _cache, ignore_errors=True)
