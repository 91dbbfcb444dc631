"""Does the draft model's acceptance tell a right KV cache from a wrong one? The target as its own draft, greedy, a pool
small enough to preempt by swapping: as built, without the follower's swaps, and with the draft's lag ignored.

    python kernels/draft_mutations.py   # CPU; prints one line per run (kept in kernels/results/spec_decode/cpu/)
"""
from paged_infer.core import draft_model
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.model.default_model import prepare_default_model

SPEC = {'model': str(prepare_default_model()), 'num_speculative_tokens': 4}
PROMPTS = ['The capital of France is', 'def fibonacci(n):', 'Once upon a time, in a land far away, there lived a']


def run(mutate=None) -> str:
    eng = LLMEngine(speculative_config=SPEC, num_gpu_blocks=10, preemption_mode='swap', num_cpu_blocks=64)
    if mutate is not None:
        mutate(eng)
    for p in PROMPTS:
        eng.add_request(p, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    c = eng.stats().spec_decode
    return f"{c['num_accepted_tokens']}/{c['num_draft_tokens']} accepted, {eng.scheduler.num_preemptions} preemptions"


def no_follower(eng):
    eng.runner.followers = []  # the draft pool no longer follows swaps


def ignore_lag(eng):
    step = draft_model.DraftModel.step

    def ahead(self, out, wants):  # the draft believed one token further than its pool holds
        self.computed = {k: (s, n + 1) for k, (s, n) in self.computed.items()}
        return step(self, out, wants)

    eng.drafter.step = ahead.__get__(eng.drafter)


if __name__ == '__main__':
    for name, m in (('as built', None), ('no follower', no_follower), ('lag ignored', ignore_lag)):
        print(f'{name}: {run(m)}', flush=True)
