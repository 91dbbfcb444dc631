"""Greedy decode of the default model (SmolLM2-135M-Instruct, float32) with Hugging Face transformers on this CPU:
milliseconds per token with 1 and 2 torch threads, then two 1-thread processes at once.

    .venv/bin/python benchmarks/results/test_time/cpu/threads_vs_processes.py
"""
import subprocess
import sys
import time

ONE = '''
import sys, time, torch
from transformers import AutoModelForCausalLM
from paged_infer.model.default_model import prepare_default_model
torch.set_num_threads(int(sys.argv[1]))
hf = AutoModelForCausalLM.from_pretrained(prepare_default_model(), dtype=torch.float32).eval()
x = torch.randint(0, 1000, (1, 20))
with torch.no_grad():
    hf(x)
    t = time.time()
    hf.generate(x, max_new_tokens=40, min_new_tokens=40, do_sample=False)
print(f'{sys.argv[1]} thread(s): {(time.time() - t) / 40 * 1000:.0f} ms per token', flush=True)
'''


def run(threads: int, copies: int = 1):
    procs = [subprocess.Popen([sys.executable, '-c', ONE, str(threads)], stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL) for _ in range(copies)]
    for p in procs: print(f'  {copies} process(es) at once, ' + p.communicate()[0].strip())


if __name__ == '__main__':
    print(time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))
    run(2)
    run(1)
    run(1, copies=2)
