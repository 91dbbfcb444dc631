"""Every notebook in nbs/ run through nbdev's own runner, one pytest test per notebook.

nbdev's runner honours `#| eval: false` and the skip flags of settings.ini (`tst_flags`: notest, gpu, slow).
Set PAGED_INFER_TEST_FLAGS="gpu" (space separated) to run flagged cells too, as on the lent GPU.
"""
import os
from pathlib import Path

import pytest
import nbdev.test  # import the module, not test_nb itself, or pytest would collect it
from nbdev.config import get_config

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.name.startswith('_'))


@pytest.mark.parametrize('nb', NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb: Path):
    skip = get_config(path=ROOT).tst_flags.split()
    force = os.environ.get('PAGED_INFER_TEST_FLAGS', '').split()
    ok, secs = nbdev.test.test_nb(nb, skip_flags=skip, force_flags=force, basepath=ROOT)
    assert ok, f'{nb.name} failed (traceback above)'
