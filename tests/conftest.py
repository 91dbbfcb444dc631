import pytest


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
