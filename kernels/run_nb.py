"""Run a chapter's code cells, `#| gpu` cells included, on a machine where nbdev is not installed (a bare GPU image).

    python kernels/run_nb.py nbs/15c_decode_attention.ipynb [nbs/11_model_runner.ipynb ...] [--log FILE]

Each notebook runs in this process's fresh namespace, from the nbs/ folder, cells in order, as nbdev's test runner
would with the gpu flag: cells marked `#| eval: false`, and the `#| hide` cells that call nbdev, are skipped, and so
is a cell that imports a module the machine lacks (said so in the output). Prints
each cell's time; the first failing cell stops that notebook (its traceback printed) and the exit status is 1.
With --log, the same lines also go to FILE (e.g. kernels/results/notebook_gpu/<machine>/kernels.log).
"""
import argparse, builtins, json, linecache, os, sys, time, traceback
from pathlib import Path


def code_cells(nb: Path):
    for i, c in enumerate(json.loads(nb.read_text())['cells']):
        src = ''.join(c['source'])
        if c['cell_type'] != 'code' or '#| eval: false' in src or ('#| hide' in src and 'nbdev' in src): continue
        yield i, src


def run(nb: Path) -> bool:
    ns, cwd = {'__name__': '__main__'}, os.getcwd()
    os.chdir(nb.parent)
    try:
        for i, src in code_cells(nb):
            t0 = time.perf_counter()
            name = f'<{nb.name} cell {i}>'
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # for inspect (Triton reads kernels' source)
            try: exec(compile(src, name, 'exec'), ns)
            except ModuleNotFoundError as e:  # e.g. hypothesis, where the image lacks it: that cell only
                print(f'{nb.name} cell {i}: skipped, {e}', flush=True); continue
            except Exception:
                print(f'{nb.name} cell {i}: FAILED\n{src[:400]}\n{traceback.format_exc()}', flush=True)
                return False
            dt = time.perf_counter() - t0
            if dt > 1 or '#| gpu' in src: print(f'{nb.name} cell {i}: {dt:.1f} s{"  (gpu)" if "#| gpu" in src else ""}', flush=True)
        print(f'{nb.name}: all cells passed', flush=True)
        return True
    finally: os.chdir(cwd)


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description="Run chapters' code cells, gpu cells included, without nbdev.")
    ap.add_argument('notebooks', nargs='+', help='notebook files (nbs/*.ipynb)')
    ap.add_argument('--log', default=None, help='also write the report lines to this file')
    a = ap.parse_args()
    if a.log:
        Path(a.log).resolve().parent.mkdir(parents=True, exist_ok=True)
        log, _print = open(Path(a.log).resolve(), 'w'), builtins.print
        def print(*args, **kw):  # the report's lines (the module's print), to the screen and the log
            _print(*args, **kw); kw.pop('file', None); _print(*args, **kw, file=log)
    paths = [Path(p).resolve() for p in a.notebooks]
    sys.exit(0 if all([run(p) for p in paths]) else 1)
