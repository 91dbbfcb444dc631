"""Build the paged-infer documentation site from the notebooks in nbs/, offline, and write README.md.

    .venv/bin/python docs/build.py                  # site into docs/_site, README.md from nbs/index.ipynb
    .venv/bin/python docs/build.py --readme-only    # README.md only: fast, nothing is executed
    .venv/bin/python docs/build.py --out DIR --build-dir DIR --readme-out FILE   # elsewhere (the tests do this)
    .venv/bin/python docs/build.py --results FILE --flags gpu   # also write how each notebook ran; run gpu cells

nbdev normally hands its processed notebooks to Quarto, which cannot be installed here. This script keeps nbdev's
own processing and replaces Quarto by nbconvert and MkDocs (Material theme). For every notebook:

1. Process it with nbdev's docs processors (`nbdev.processors.FilterDefaults`): title and summary from the first
   markdown cell, `#| hide` cells dropped, a `show_doc` cell after each `#| export` cell (the API reference),
   names in backticks linked to their docs. Two processors are swapped for this site: exported code stays visible
   (nbdev hides it), and the whole notebook is executed, not only the cells that `show_doc` needs:
2. Execute it with execnb's `CaptureShell` in nbs/, skipping the cells that `nbdev_test` skips (`tst_flags` of
   settings.ini, `#| eval: false`), so printed outputs and matplotlib figures land in the page.
   Each notebook runs in a fresh process; a failing notebook fails the build, named.
3. Convert it to a markdown page with nbconvert (docs/templates/page.md.j2 sets outputs apart from code);
   figures become image files beside it; `#| echo: false`, `#| output: false`, `#| include: false` are honoured.

Then:
4. Build the pages with MkDocs into the site (docs/mkdocs.yml), one page per notebook, in notebook order.
5. Write README.md from index.ipynb, with chapter links pointing into nbs/.
"""
import argparse
import json
import logging
import multiprocessing
import multiprocessing.pool
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
import yaml
from execnb.nbio import nb2str, read_nb
from execnb.shell import CaptureShell, format_exc
from fastcore.basics import str2bool
from fastcore.xtras import working_directory
from nbconvert import MarkdownExporter
from nbdev.config import get_config
from nbdev.doclinks import _nbpath2html, nbglob
from nbdev.process import NBProcessor, Processor, extract_directives, first_code_ln
from nbdev.processors import FilterDefaults, add_links, exec_show_docs, rm_export
from traitlets.config import Config

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
CFG = get_config(path=ROOT)
NBS = CFG.nbs_path
DOC_URL = f'{CFG.doc_host}{CFG.doc_baseurl}/'  # where nbdev's _modidx.py says the pages live


# 1-2. nbdev's processing, executing every cell ------------------------------------------------------------------

def skipped(cell, flags: set) -> bool:
    "Whether `nbdev.test.test_nb` skips this cell: a skip flag, `#| eval: false`, or the nbdev_export() call."
    d = getattr(cell, 'directives_', None) or {}
    return 'nbdev_export(' in cell.source or d.get('eval:', [''])[0].lower() == 'false' or bool(flags & d.keys())


class exec_cells(Processor):
    "Run the notebook's code cells in one shell, as nbdev_test does, storing their outputs (replaces exec_show_docs)."
    def __init__(self, nb, flags=frozenset()):
        super().__init__(nb)
        self.flags, self.ran = set(flags), False

    def begin(self):
        self.skip_all = str2bool(self.nb.frontmatter_.get('skip_exec', False))  # frontmatter `skip_exec: true`
        self.k = CaptureShell(self.nb.path_)  # puts nbs/ on sys.path, shows matplotlib figures inline
        self.k.run_cell('from nbdev.showdoc import show_doc')

    def cell(self, cell):
        if cell.cell_type != 'code': return
        # a show_doc cell (added after an exported cell) runs only if the cell it documents ran
        if not getattr(cell, 'has_sd', False): self.ran = not (self.skip_all or skipped(cell, self.flags))
        if not self.ran: return
        self.k.cell(cell)
        if self.k.exc:
            tb = ''.join(format_exc(self.k.exc))
            # a builtin exception, so that it pickles back from the worker (whose __main__ IPython replaced)
            raise RuntimeError(f'{Path(self.nb.path_).name}: this cell failed\n\n{cell.source}\n\n{tb}')


def default_exp_(cell, *args):
    "Drop the `#| default_exp` cell (replaces rm_export, which would also hide the exported code)."
    del cell['source']


def collapse_cr(cell):
    "Show progress bars in stream outputs as a terminal leaves them: only the text after a line's last `\\r`."
    for o in cell.get('outputs', []):
        if o.get('output_type') == 'stream': o['text'] = [re.sub(r'[^\n]*\r(?!\n)', '', ''.join(o['text']))]


REMOVE_TAGS = {('echo:', 'false'): 'remove_input', ('output:', 'false'): 'remove_output',
               ('include:', 'false'): 'remove_cell'}


def quarto_to_tags(cell):
    "Turn the Quarto directives left in a code cell (`#| echo: false`...) into nbconvert's remove tags; drop them."
    if cell.cell_type != 'code': return
    d = extract_directives(cell, remove=False)
    lines = cell.source.splitlines(True)
    n = first_code_ln(lines)
    cell.source = '' if n is None else ''.join(lines[n:])
    tags = [tag for (k, v), tag in REMOVE_TAGS.items() if d.get(k, [''])[0].lower() == v]
    if not cell.source.strip(): tags.append('remove_input')
    cell.metadata['tags'] = tags


def processors(nb, execute=True, flags=()):
    "nbdev's docs processors for `nb` (honouring settings.ini's procs and skip_procs), adapted to this site."
    swap = {exec_show_docs: exec_cells(nb, flags) if execute else None, rm_export: default_exp_,
            add_links: add_links if execute else None}  # the README links to notebooks, not to the site
    return [swap.get(p, p) for p in FilterDefaults().procs() if swap.get(p, p)] + [collapse_cr, quarto_to_tags]


def process(nb_path: Path, execute=True, flags=()):
    "The notebook at `nb_path` after nbdev's processing (and execution, in nbs/)."
    with working_directory(NBS):
        nb = read_nb(nb_path)
        NBProcessor(nb=nb, procs=processors(nb, execute, flags), process=True)
    return nb


# 3. Markdown pages -----------------------------------------------------------------------------------------------

NBCONVERT = Config(TagRemovePreprocessor=dict(
    enabled=True, remove_cell_tags={'remove_cell'}, remove_input_tags={'remove_input'},
    remove_all_outputs_tags={'remove_output'}))


def page_of(nb_path: Path) -> Path:
    "The page nbdev gives a notebook, as markdown: nbs/00_default_model.ipynb -> default_model.md."
    return _nbpath2html(nb_path.relative_to(NBS)).with_suffix('.md')


def title_of(nb, plain=False) -> str:
    "The notebook's title from its first markdown cell (`# Title`), else its file name; `plain`: no backticks."
    title = nb.frontmatter_.get('title') or Path(nb.path_).stem
    return title.replace('`', '') if plain else title


def to_markdown(nb, name: str):
    "Markdown of a processed notebook (nbconvert), and its figures as {file name: bytes} under `{name}_files/`."
    nb.cells = [c for c in nb.cells if c.cell_type != 'raw']  # the frontmatter cell; page_header() replaces it
    nb = nbformat.reads(nb2str(nb), as_version=4)
    nb.metadata['language_info'] = {'name': 'python'}  # code blocks are fenced as ```python
    resources = {'output_files_dir': f'{name}_files', 'unique_key': name}
    exporter = MarkdownExporter(config=NBCONVERT, template_file=str(DOCS / 'templates' / 'page.md.j2'))
    md, resources = exporter.from_notebook_node(nb, resources=resources)
    return md.strip() + '\n', resources.get('outputs', {})


def page_header(nb) -> str:
    "The title as the page's heading, the summary under it."
    fm = nb.frontmatter_
    return f'# {title_of(nb)}\n\n' + (f"> {fm['description']}\n\n" if fm.get('description') else '')


REPO_LINK = re.compile(r'\]\(\.\./(?=[^)\s]+\))')  # a link out of nbs/ to a repository file: ](../kernels/
NB_LINK = re.compile(r'\]\((?![a-z]+:)([^)\s#]+\.ipynb)')  # a markdown link to a notebook: ](00_default_model.ipynb


def relink_for_site(md: str) -> str:
    "Point links to notebooks and to nbdev's docs URLs (from `add_links`) at this site's pages."
    md = NB_LINK.sub(lambda m: '](' + _nbpath2html(Path(m[1])).with_suffix('.md').as_posix(), md)
    return re.sub(re.escape(DOC_URL) + r'([^)\s#]+)\.html', r'\1.md', md)


def write_page(nb_path: Path, md_dir: Path, flags=()) -> dict:
    "Steps 1-3 for one notebook: write its page and figures into `md_dir`; return its navigation entry."
    t0 = time.time()
    nb = process(nb_path, execute=True, flags=flags)
    page = md_dir / page_of(nb_path)
    md, figures = to_markdown(nb, page.stem)
    meta = yaml.safe_dump({'title': title_of(nb, plain=True), 'description': nb.frontmatter_.get('description', '')})
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f'---\n{meta}---\n\n' + page_header(nb) + relink_for_site(md))
    for name, data in figures.items():
        (page.parent / name).parent.mkdir(parents=True, exist_ok=True)
        (page.parent / name).write_bytes(data)
    print(f'  {nb_path.name} -> {page.name}: {time.time() - t0:.1f} s', flush=True)
    return {title_of(nb, plain=True): page_of(nb_path).as_posix()}


class _NonDaemonProcess(multiprocessing.get_context('fork').Process):
    "A pool worker that may start processes of its own (chapter 18 starts its tensor-parallel ranks): not daemonic."
    @property
    def daemon(self): return False
    @daemon.setter
    def daemon(self, value): pass

class _NonDaemonContext(type(multiprocessing.get_context('fork'))):
    Process = _NonDaemonProcess


def write_pages(notebooks: list, md_dir: Path, flags: set, workers: int, results: Path = None) -> list:
    """Steps 1-3 for every notebook, each in a fresh process; the navigation, or exit naming the notebooks that failed.
    With `results`, first write there, as JSON, how each notebook went: {name: {"ok": bool, "error": text}}."""
    with multiprocessing.pool.Pool(workers, maxtasksperchild=1, context=_NonDaemonContext()) as pool:
        jobs = {nb: pool.apply_async(write_page, (nb, md_dir, flags)) for nb in notebooks}
        nav, failed, report = [], [], {}
        for nb, job in jobs.items():
            try:
                nav.append(job.get())
                report[nb.name] = {'ok': True, 'error': ''}
            except Exception as e:
                failed.append(nb.name)
                report[nb.name] = {'ok': False, 'error': f'{type(e).__name__}: {e}'}
                print(f'\n{type(e).__name__}: {e}', file=sys.stderr)
    if results: results.write_text(json.dumps(report, indent=1) + '\n')
    if failed: sys.exit(f'docs build FAILED: {", ".join(failed)} (traceback above)')
    return nav


def copy_images(md_dir: Path):
    "Copy the image files of nbs/ (that markdown cells may show) beside the pages."
    for f in NBS.rglob('*'):
        if f.suffix.lower() in {'.png', '.jpg', '.jpeg', '.gif', '.svg'} and not f.name.startswith('.'):
            (md_dir / f.relative_to(NBS)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, md_dir / f.relative_to(NBS))


# 4. The site -----------------------------------------------------------------------------------------------------

def build_site(md_dir: Path, out: Path, nav: list):
    "Build the pages in `md_dir` with MkDocs and docs/mkdocs.yml into `out`."
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    logging.basicConfig(format='mkdocs %(levelname)s: %(message)s')
    logging.getLogger('mkdocs').setLevel(logging.INFO)  # its warnings: broken links, missing files
    cfg = load_config(str(DOCS / 'mkdocs.yml'), docs_dir=str(md_dir), site_dir=str(out), nav=nav,
                      site_name=CFG.title, site_description=CFG.description, copyright=f'© {CFG.copyright}')
    cfg.plugins.on_startup(command='build', dirty=False)
    try: build(cfg)
    finally: cfg.plugins.on_shutdown()


# 5. README.md ----------------------------------------------------------------------------------------------------

def readme() -> str:
    "README.md: the processed index notebook, not executed, its links to notebooks and repository files made right."
    nb = process(NBS / CFG.readme_nb, execute=False)
    md, _ = to_markdown(nb, 'README')
    nbs_dir = NBS.relative_to(ROOT).as_posix()
    md = NB_LINK.sub(rf']({nbs_dir}/\1', md)
    md = REPO_LINK.sub('](', md)  # ../benchmarks/README.md from nbs/ is benchmarks/README.md from the top
    return page_header(nb) + md


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', type=Path, default=DOCS / '_site', help='where the site goes (default docs/_site)')
    p.add_argument('--build-dir', type=Path, default=DOCS / '_build', help='the markdown pages (default docs/_build)')
    p.add_argument('--readme-out', type=Path, default=ROOT / 'README.md', help='where README.md goes')
    p.add_argument('--readme-only', action='store_true', help='write README.md only (nothing is executed)')
    p.add_argument('--flags', default='', help='tst_flags whose cells run anyway, space separated (e.g. gpu)')
    p.add_argument('--workers', type=int, default=2, help='notebooks executed at once')
    p.add_argument('--results', type=Path, help='write how each notebook ran here, as JSON (the tests read it)')
    args = p.parse_args()
    t0 = time.time()

    args.readme_out.write_text(readme())
    print(f'wrote {args.readme_out}')
    if args.readme_only: return

    flags = set(CFG.tst_flags.split()) - set(args.flags.split())
    with working_directory(NBS): notebooks = sorted(nbglob(NBS, as_path=True))
    notebooks.sort(key=lambda p: p.name != CFG.readme_nb)  # index.ipynb first: the home page
    shutil.rmtree(args.build_dir, ignore_errors=True)
    args.build_dir.mkdir(parents=True)
    print(f'executing {len(notebooks)} notebooks in {NBS}')
    nav = write_pages(notebooks, args.build_dir, flags, args.workers, args.results)
    copy_images(args.build_dir)
    build_site(args.build_dir, args.out, nav)
    print(f'site built in {time.time() - t0:.0f} s: {args.out / "index.html"}')


if __name__ == '__main__':
    main()
