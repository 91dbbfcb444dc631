"Execute a chapter's code cells in order (figures, the export cell and `#| gpu` cells left out) and print what they print."
import json, sys
nb = json.load(open(sys.argv[1]))
g = {}
for c in nb['cells']:
    s = ''.join(c['source'])
    if c['cell_type'] == 'code' and 'nbdev' not in s and 'matplotlib' not in s and not s.startswith('#| gpu'):
        exec(s, g)
