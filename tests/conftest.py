"""Every test runs offline with Hugging Face (and torch.compile) caches in a temporary folder."""

import os
import sys
import tempfile
from pathlib import Path

_CACHE = tempfile.mkdtemp(prefix="txv-hf-cache-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = _CACHE
os.environ["HF_HUB_CACHE"] = os.path.join(_CACHE, "hub")
os.environ["HF_MODULES_CACHE"] = os.path.join(_CACHE, "modules")
os.environ["HF_DATASETS_CACHE"] = os.path.join(_CACHE, "datasets")
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch.compile's kernel caches too: inductor's key omits ATEN_CPU_CAPABILITY, so a run under `default` (whose C++
# fails to build) left kernels that broke the next run's compiled tests under avx2 in the shared /tmp/torchinductor_*
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHE, "inductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_CACHE, "triton")

sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n N`: the N workers share the cores, one torch thread each
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_dynamo_state():
    """torch.compile's caches (and its automatic dynamic-shape decisions, keyed by shared code objects such as
    transformers' output decorators) would otherwise carry from one test's compiled model into the next."""
    yield
    torch._dynamo.reset()


@pytest.fixture
def one_torch_thread():
    """Tiny models: one torch thread is fastest, and avoids oversubscribing a shared 2-core CI machine (a module
    opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
