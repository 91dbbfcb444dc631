"""Every notebook in nbs/ runs, top to bottom, each in a fresh process: one pytest test per notebook.

The notebooks run once per test session, in the build of the documentation site (the `build` fixture of conftest.py,
docs/build.py): with execnb's shell, as nbdev's own runner `nbdev_test` runs them, skipping what it skips
(`#| eval: false` and the flags of settings.ini's `tst_flags`: notest, gpu, slow). Set PAGED_INFER_TEST_FLAGS="gpu"
(space separated) to run flagged cells too, on a machine with a GPU.
A fresh process per notebook, as a learner runs one: state (an imported Triton, a set environment variable such as
TRITON_INTERPRET) cannot leak from one chapter into the next.
"""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.name.startswith(('_', '.')))


@pytest.fixture(scope='session')
def results(build) -> dict:
    "How each notebook ran in the build: {name: {'ok': bool, 'error': text}}."
    tmp, r = build
    f = tmp / 'results.json'
    assert f.is_file(), f'docs/build.py ran no notebook\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}'
    return json.loads(f.read_text())


@pytest.mark.parametrize('nb', NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(results, nb: Path):
    assert nb.name in results, f'{nb.name} was not executed'
    assert results[nb.name]['ok'], f'{nb.name} failed:\n{results[nb.name]["error"][-6000:]}'
