"""pytest configuration of the customconv suite.

`import customconv` loads the library (CUSTOMCONV_LIBRARY, else the package
directory, else the repository's build tree). Every test is seeded from its
own id, so a failure reproduces by running that one test; the seed is printed
in assertion messages and in the report header of a failing test.
"""

import os
import random

import pytest
import torch

import customconv  # noqa: F401  (registers torch.ops.customconv.*)
from testlib import seed_for


def pytest_configure(config):
    # The tests use small tensors, where intra-op threads only add overhead
    # (much of it on a loaded 2-core CI machine). The multi-threaded CPU path
    # runs in test_conv2d_matches_torch_when_the_workspace_limit_splits_the_batch,
    # in a subprocess with 2 threads.
    torch.set_num_threads(1)
    # float32 results are checked at float32's precision; conv2d's TF32 policy
    # (it follows F.conv2d's) has its own test in test_conv2d_matches_torch.py.
    # (The legacy flag sets cuDNN's conv and RNN precision together; setting
    # only the conv one makes torch.export refuse the mix.)
    torch.backends.cudnn.allow_tf32 = False
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA device; skipped when torch.cuda.is_available() is False"
    )
    config.addinivalue_line(
        "markers", "unallocatable: a bad-input case whose output no machine can allocate"
    )


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
        pytest.skip("needs CUDA: torch.cuda.is_available() is False")


def pytest_report_header(config):
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"torch {torch.__version__}; customconv library {customconv.LIBRARY_PATH}; CUDA device: {cuda}"


def _test_key(item) -> str:
    # File name and test name with its parameters: independent of the rootdir
    # and of the directory pytest runs from.
    return f"{os.path.basename(str(item.path))}::{item.name}"


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """This test's seed (also applied to torch's and Python's global generators)."""
    s = seed_for(_test_key(request.node))
    torch.manual_seed(s)
    random.seed(s)
    request.node.user_properties.append(("seed", s))
    return s


@pytest.fixture
def rng(seed) -> random.Random:
    """A Python random generator seeded for this test (for configurations)."""
    return random.Random(seed)


@pytest.fixture
def gen(seed) -> torch.Generator:
    """A CPU torch generator seeded for this test (for tensor values)."""
    return torch.Generator().manual_seed(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("seed", f"{_test_key(item)} ran with seed {seed_for(_test_key(item))}"))
