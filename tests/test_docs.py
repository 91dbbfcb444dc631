"""The documentation site and README.md, as docs/build.py makes them (see its docstring).

The site is built once per test session, into a temporary folder (the `build` fixture of conftest.py); that executes
every notebook once, and tests/test_notebooks.py reads from the same build how each notebook ran. Checked: every
notebook has its page with its title, in the navigation, in order; no `#|` directive shows in code; pages show
printed outputs, and the figures of notebooks that use matplotlib as real image files; the API reference (show_doc)
names a function or class of each module; no page loads anything from the internet; README.md is what `docs/build.py
--readme-only` writes now; a failing notebook fails the build, named; and, where /usr/bin/chromium exists, a page
renders to a non-blank screenshot.
Pages are named as on nbdev's sites: nbs/00_default_model.ipynb -> default_model.html, index.ipynb -> index.html.
"""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from nbdev.config import get_config

from conftest import BUILD, run_build

ROOT = Path(__file__).resolve().parents[1]
CFG = get_config(path=ROOT)
NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.name.startswith(('_', '.')))
IDS = [p.stem for p in NOTEBOOKS]


def page_name(nb: Path) -> str:
    "The page of a notebook, as nbdev names it: the number prefix dropped, .html."
    return re.sub(r'^\d+[a-zA-Z0-9]*_', '', nb.stem.lower()) + '.html'


def code_cells(nb: Path) -> list:
    "Sources of the notebook's code cells."
    return [''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']


def runs_for_docs(src: str) -> bool:
    "Whether the build executes this cell: no skip flag of settings.ini, no `#| eval: false`."
    flags = '|'.join(map(re.escape, CFG.tst_flags.split()))
    return not re.search(rf'^\s*#\|\s*((?:{flags})\s*$|eval:\s*false)', src, re.MULTILINE | re.IGNORECASE)


def first_title(nb: Path) -> str:
    "The `# Title` of the notebook's first markdown cell, without its backticks."
    md = next(''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'markdown')
    return re.search(r'^#\s+(.+?)\s*$', md, re.MULTILINE)[1].replace('`', '')


def text(el) -> str:
    "An element's text without the ¶ permalinks."
    for a in el.select('a.headerlink'): a.decompose()
    return el.get_text().strip()


def test_site_builds(build):
    _, r = build
    assert r.returncode == 0, f'docs/build.py failed\n{r.stdout[-4000:]}\n{r.stderr[-12000:]}'


@pytest.fixture(scope='module')
def site(build) -> Path:
    "The built site; the tests that look at it skip when the build failed (test_site_builds says why)."
    tmp, r = build
    if r.returncode != 0: pytest.skip('docs/build.py failed: see test_site_builds')
    return tmp / 'site'


def soup(site: Path, nb: Path) -> BeautifulSoup:
    return BeautifulSoup((site / page_name(nb)).read_text(encoding='utf-8'), 'html.parser')


@pytest.mark.parametrize('nb', NOTEBOOKS, ids=IDS)
def test_page_with_title(site, nb):
    assert (site / page_name(nb)).is_file(), f'no page for {nb.name}'
    s = soup(site, nb)
    assert text(s.select_one('article h1')) == first_title(nb)
    assert s.title.get_text().startswith(first_title(nb))


def test_navigation_lists_every_chapter_in_order(site):
    nav = soup(site, ROOT / 'nbs' / 'index.ipynb').select_one('nav.md-nav--primary')
    hrefs = [a['href'] for a in nav.select('a.md-nav__link') if not a['href'].startswith('#')]
    home = [p for p in NOTEBOOKS if p.name == CFG.readme_nb]
    assert hrefs == [page_name(p) for p in home + [p for p in NOTEBOOKS if p not in home]]


@pytest.mark.parametrize('nb', NOTEBOOKS, ids=IDS)
def test_no_nbdev_directive_in_code(site, nb):
    for code in soup(site, nb).select('article .highlight code'):
        assert not re.search(r'^\s*#\|', code.get_text(), re.MULTILINE), code.get_text()[:500]


PRINTS = [p for p in NOTEBOOKS if any('print(' in s and runs_for_docs(s) for s in code_cells(p))]


@pytest.mark.parametrize('nb', PRINTS, ids=[p.stem for p in PRINTS])
def test_printed_outputs_shown(site, nb):
    assert soup(site, nb).select('article .nb-output'), f'{nb.name} prints, but its page shows no output'


def is_image(site: Path, page: Path, src: str) -> bool:
    "Whether `src` of an <img> on `page` is a data: image or a PNG/SVG file of the site."
    if src.startswith('data:image/'): return True
    f = (page.parent / src).resolve()
    if not f.is_relative_to(site.resolve()) or not f.is_file(): return False
    head = f.read_bytes()[:400]
    return head.startswith(b'\x89PNG\r\n\x1a\n') or b'<svg' in head


FIGURES = [p for p in NOTEBOOKS if any(re.search(r'\bplt\.|matplotlib', s) and runs_for_docs(s) for s in code_cells(p))]


@pytest.mark.parametrize('nb', FIGURES, ids=[p.stem for p in FIGURES])
def test_figures_embedded(site, nb):
    page = site / page_name(nb)
    imgs = [img['src'] for img in soup(site, nb).select('article img')]
    assert any(is_image(site, page, src) for src in imgs), f'{nb.name} uses matplotlib, its page has no image: {imgs}'


def exported_defs(module: str) -> list:
    "Functions and classes that paged_infer/`module`.py lists in `__all__`."
    tree = ast.parse((ROOT / CFG.lib_name / f'{module.replace(".", "/")}.py').read_text())
    defs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, 'id', '') == '__all__' for t in n.targets)), [])
    return [n for n in names if n in defs]


DEFAULT_EXP = re.compile(r'^#\|\s*default_exp\s+(\S+)', re.MULTILINE)
MODULES = [(p, m[1]) for p in NOTEBOOKS for s in code_cells(p) if (m := DEFAULT_EXP.search(s))]


@pytest.mark.parametrize('nb,module', MODULES, ids=[m for _, m in MODULES])
def test_api_reference(site, nb, module):
    names = exported_defs(module)
    if not names: pytest.skip(f'{module} exports no function or class')
    headings = {text(h) for h in soup(site, nb).select('article h3')}
    assert headings & set(names), f'no show_doc of any of {names} on the page of {nb.name}'


def test_nothing_loaded_from_the_internet(site):
    for page in site.rglob('*.html'):
        s = BeautifulSoup(page.read_text(encoding='utf-8'), 'html.parser')
        remote = [t.get('src') or t.get('href') for t in s.select('script[src], img[src], link[href], iframe[src]')
                  if re.match(r'(https?:)?//', t.get('src') or t.get('href'))]
        assert not remote, f'{page.name} loads {remote}'


def test_readme_matches_index_notebook(tmp_path):
    r = run_build('--readme-only', '--readme-out', tmp_path / 'README.md', timeout=120)
    assert r.returncode == 0, r.stderr
    fresh = (tmp_path / 'README.md').read_text()
    assert (ROOT / 'README.md').read_text() == fresh, \
        'README.md is out of date with nbs/index.ipynb: run `.venv/bin/python docs/build.py --readme-only`'
    for link in re.findall(r'\]\(([^)#\s]+\.ipynb)', fresh):
        assert link.startswith(f'{CFG.nbs_path.name}/'), f'README links to {link}, not into nbs/'


def test_full_build_writes_the_same_readme(site):
    assert (site.parent / 'README.md').read_text() == (ROOT / 'README.md').read_text()


BROKEN = '''
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location('docs_build', sys.argv[1])
build = sys.modules['docs_build'] = importlib.util.module_from_spec(spec)  # registered: its workers unpickle it
spec.loader.exec_module(build)
build.NBS = Path(sys.argv[2])
build.write_pages([build.NBS / '99_broken.ipynb'], Path(sys.argv[3]), set(), 1, Path(sys.argv[4]))
'''


def test_failing_notebook_fails_the_build(tmp_path):
    import nbformat
    (tmp_path / 'nbs').mkdir()
    cells = [nbformat.v4.new_markdown_cell('# Broken'), nbformat.v4.new_code_cell('1/0')]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / 'nbs' / '99_broken.ipynb')
    r = subprocess.run([sys.executable, '-c', BROKEN, str(BUILD), str(tmp_path / 'nbs'), str(tmp_path / 'md'),
                        str(tmp_path / 'results.json')],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert 'docs build FAILED: 99_broken.ipynb' in r.stderr and 'ZeroDivisionError' in r.stderr, r.stderr
    report = json.loads((tmp_path / 'results.json').read_text())  # what tests/test_notebooks.py reads
    assert not report['99_broken.ipynb']['ok'] and 'ZeroDivisionError' in report['99_broken.ipynb']['error'], report


CHROMIUM = Path('/usr/bin/chromium')


@pytest.mark.skipif(not CHROMIUM.exists(), reason='no /usr/bin/chromium (Debian package `chromium`) for the screenshot')
def test_screenshot_of_a_page(site, tmp_path):
    nb = (FIGURES or NOTEBOOKS)[0]
    shot = tmp_path / 'page.png'
    subprocess.run([str(CHROMIUM), '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
                    '--window-size=1280,2000', f'--screenshot={shot}', (site / page_name(nb)).as_uri()],
                   capture_output=True, timeout=120)
    assert shot.is_file(), 'chromium wrote no screenshot'
    import matplotlib.image
    px = matplotlib.image.imread(shot)
    assert px.shape[:2] == (2000, 1280)
    assert px.std() > 0.05, 'the page rendered blank'
