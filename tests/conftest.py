"""What the tests share: the GPU marker, and the one build of the documentation site (which executes every notebook).

Under pytest-xdist (`make test` runs two workers), each test module goes whole to one worker (its module fixtures are
made once), and tests/test_docs.py and tests/test_notebooks.py go together, so that the site is built once, by one
worker, while the other runs the remaining modules.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / 'docs' / 'build.py'


def run_build(*args, timeout=3600):
    "Run docs/build.py with `args`; the completed process."
    return subprocess.run([sys.executable, str(BUILD), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope='session')
def build(tmp_path_factory):
    """The one build of the site: (its folder, the finished build.py process). Its notebooks run with the skip flags of
    settings.ini, less those in PAGED_INFER_TEST_FLAGS (e.g. "gpu"); PAGED_INFER_DOCS_WORKERS notebooks at once
    (default: 1 beside another xdist worker, else 2). How each notebook ran is in results.json of the folder."""
    tmp = tmp_path_factory.mktemp('docs')
    workers = os.environ.get('PAGED_INFER_DOCS_WORKERS', '1' if os.environ.get('PYTEST_XDIST_WORKER') else '2')
    return tmp, run_build('--out', tmp / 'site', '--build-dir', tmp / 'md', '--readme-out', tmp / 'README.md',
                          '--results', tmp / 'results.json', '--workers', workers,
                          '--flags', os.environ.get('PAGED_INFER_TEST_FLAGS', ''))


DOCS_MODULES = ('tests/test_docs.py', 'tests/test_notebooks.py')


def pytest_xdist_make_scheduler(config, log):
    "pytest-xdist's scheduling by scope, a scope being a test module, the two modules of the docs build one scope."
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split('::')[0]
            return 'docs build' if module in DOCS_MODULES else module

    return ByModule(config, log)


def pytest_configure(config):
    config.addinivalue_line('markers', 'gpu: needs a CUDA GPU (skipped where there is none)')
    config.addinivalue_line('markers', 'slow: long-running')


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    skip_gpu = pytest.mark.skip(reason='no CUDA GPU here')
    for item in items:
        if 'gpu' in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
