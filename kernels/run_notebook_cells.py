"""Run a notebook's code cells in order as one script, `#| gpu` cells included (for a GPU machine without nbdev).

    python kernels/run_notebook_cells.py nbs/15g_quant_gemm.ipynb
"""
import json
import sys

cells = json.load(open(sys.argv[1]))['cells']
code = [''.join(c['source']) for c in cells if c['cell_type'] == 'code']
code = [c for c in code if not c.startswith('#| default_exp') and '#| eval: false' not in c]
exec(compile('\n\n'.join(code), sys.argv[1], 'exec'), {'__name__': '__main__'})
print('all code cells ran:', len(code))
