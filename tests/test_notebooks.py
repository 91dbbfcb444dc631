"""Every notebook in nbs/ run through nbdev's own runner, one pytest test per notebook, each in a fresh process.

nbdev's runner honours `#| eval: false` and the skip flags of settings.ini (`tst_flags`: notest, gpu, slow).
Set PAGED_INFER_TEST_FLAGS="gpu" (space separated) to run flagged cells too, on a machine with a GPU.
A fresh process per notebook, as a learner runs one: state (an imported Triton, a set environment variable such as
TRITON_INTERPRET) cannot leak from one chapter into the next.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.name.startswith('_'))

RUN = """
import os, sys
from pathlib import Path
import nbdev.test  # the module, not test_nb itself
from nbdev.config import get_config
root, nb = Path(sys.argv[1]), Path(sys.argv[2])
ok, secs = nbdev.test.test_nb(nb, skip_flags=get_config(path=root).tst_flags.split(),
                              force_flags=os.environ.get('PAGED_INFER_TEST_FLAGS', '').split(), basepath=root)
sys.exit(0 if ok else 1)
"""


@pytest.mark.parametrize('nb', NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb: Path):
    r = subprocess.run([sys.executable, '-c', RUN, str(ROOT), str(nb)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, f'{nb.name} failed:\n{r.stderr[-6000:]}'
