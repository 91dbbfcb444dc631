"""Run a chapter's code cells, `#| gpu` cells included, where nbdev is not installed (the lent GPU's image).

    PYTHONPATH=. python kernels/run_nb.py nbs/15_kernels.ipynb [nbs/11_model_runner.ipynb ...]

Each notebook runs in this process's fresh namespace, from the nbs/ folder, cells in order, as nbdev's test runner
would with the gpu flag: cells marked `#| eval: false`, and the `#| hide` cells that call nbdev, are skipped, and so
is a cell that imports a module the machine lacks (said so in the output). Prints
each cell's time; the first failing cell stops that notebook (its traceback printed) and the exit status is 1.
"""
import json, linecache, os, sys, time, traceback
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
    sys.exit(0 if all([run(Path(p).resolve()) for p in sys.argv[1:]]) else 1)
