import random, time
import numpy as np
from paged_infer.core.spec_decode import ngram_propose, ngram_propose_many
rng = random.Random(0)
for B in (1, 2, 4, 16, 64):
    arrays = []
    for _ in range(B):
        base = [rng.randrange(100, 4000) for _ in range(40)] * 6
        arrays.append(np.array(base + base[:rng.randrange(1, 200)], dtype=np.int64))
    for name, f in (('together', lambda: ngram_propose_many(arrays, 4, 4, 2)), ('one by one', lambda: [ngram_propose(a, 4, 4, 2) for a in arrays])):
        f()
        t0 = time.perf_counter()
        for _ in range(2000):
            f()
        print(f'{B:3d} sequences, {name:10s}: {(time.perf_counter() - t0) / 2000 * 1e6:7.1f} us a call')
