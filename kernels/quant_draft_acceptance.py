"""How often a quantized copy of the default model guesses the model's own next tokens, as a speculative draft.

    python kernels/quant_draft_acceptance.py [--formats awq,gptq,ct-fp8-dynamic,ct-w8a16] [--k 4] [--tokens 64]

Each draft is a checkpoint of SmolLM2-135M-Instruct written by the library that defines its format (the tests'
`tests/quant_checkpoints.py` makes and caches them). Six prompts, greedy; the script prints, for each format, whether
the tokens are those of the model without speculation, and the drafted and accepted token counts.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'tests'))

from quant_checkpoints import checkpoint  # noqa: E402

from paged_infer.core.engine import LLMEngine  # noqa: E402
from paged_infer.core.sampling_params import SamplingParams  # noqa: E402

PROMPTS = ['The capital of France is', 'def fibonacci(n):', 'Once upon a time, in a land far away, there lived a',
           'Write a short poem about the sea.', 'Explain what a hash table is.', 'List three uses of copper:']


def run(engine, tokens):
    "The token ids of every prompt's greedy answer, in prompt order."
    greedy = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, greedy, str(i))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return [done[str(i)] for i in range(len(PROMPTS))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--formats', default='awq,gptq,ct-fp8-dynamic,ct-w8a16')
    ap.add_argument('--k', type=int, default=4)
    ap.add_argument('--tokens', type=int, default=64)
    args = ap.parse_args()
    base = run(LLMEngine(num_gpu_blocks=128), args.tokens)
    for name in args.formats.split(','):
        folder, _ = checkpoint(name)
        spec = {'model': str(folder), 'num_speculative_tokens': args.k}
        engine = LLMEngine(num_gpu_blocks=128, speculative_config=spec)
        out = run(engine, args.tokens)
        counts = engine.stats().spec_decode
        rate = counts['num_accepted_tokens'] / max(1, counts['num_draft_tokens'])
        print(f'{name}: same tokens {out == base}, drafted {counts["num_draft_tokens"]}, '
              f'accepted {counts["num_accepted_tokens"]}, acceptance {rate:.3f}', flush=True)


if __name__ == '__main__':
    main()
