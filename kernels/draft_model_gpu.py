"""A draft model on the GPU: its one-token forwards eager or through its own CUDA graphs, sampled drafts checked
against q, an fp8 copy as the draft; checked and timed.

    python kernels/draft_model_gpu.py --model DIR [--load-format dummy] [--out FILE.json]

DIR holds a model's config and tokenizer (with `--load-format dummy`, seeded random weights: the target and its own
draft get the same ones). Every run decodes one request at a time (batch 1), four prompts, 128 tokens each, k = 4:

- no drafts, greedy: the control;
- the model as its own draft, greedy, its forwards eager (the draft runner's graphs removed), then through its graphs:
  the tokens must be the control's, and the acceptance of the two the same within 2 points (a wrong graph replay
  shows as rejected drafts), the graphs replayed;
- the same at temperature 0.8 through the graphs: q = p up to rounding, so nearly every guess is kept;
- an fp8 copy as the draft (quantized at load), greedy: the control's tokens.

Each run is timed after an untimed pass of its first prompt; prints and writes ms per output token, acceptance, graph
replays of the draft, and whether the pool ended free.
"""
import argparse
import json
import time

import torch

from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams

PROMPTS = ['Repeat this passage exactly: the river rose slowly through the night, and the farmers moved their cattle.',
           'Write a short poem about the sea.', 'Explain what a hash table is.', 'List three uses of copper:']


def run(eng, params) -> tuple:
    "Each prompt alone, one after another: (token ids per prompt, seconds)."
    out, t0 = [], time.perf_counter()
    for i, p in enumerate(PROMPTS):
        eng.add_request(p, params, str(i))
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished:
                    out.append(o.outputs[0].token_ids)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--load-format', default='auto')
    ap.add_argument('--dtype', default='bfloat16')
    ap.add_argument('--tokens', type=int, default=128)
    ap.add_argument('--out', default=None)
    ap.add_argument('--device', default='cuda', help='cpu: a smoke test of the script (no graphs)')
    a = ap.parse_args()
    greedy = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, max_tokens=a.tokens, ignore_eos=True, seed=3)
    draft = {'model': a.model, 'num_speculative_tokens': 4, 'disable_when_slower': False}
    runs = {  # name: (speculative config, params, keep the draft's graphs)
        'no drafts': (None, greedy, True),
        'own draft, eager draft': (draft, greedy, False),
        'own draft, draft graphs': (draft, greedy, True),
        'own draft, sampled': (draft, sampled, True),
        'fp8 copy': (draft | {'quantization': 'fp8'}, greedy, True),
    }
    results, control = {}, None
    for name, (spec, params, graphs) in runs.items():
        eng = LLMEngine(model=a.model, load_format=a.load_format, dtype=a.dtype, device=a.device, max_num_seqs=8,
                        speculative_config=spec)
        replays = []
        if eng.drafter is not None:
            r = eng.drafter.runner
            if not graphs:
                r.graphs = None
            elif r.graphs is not None:
                replay = r.graphs.run
                r.graphs.run = lambda ids, *x, **k: replays.append(len(ids)) or replay(ids, *x, **k)
        eng.add_request(PROMPTS[0], params, 'warm')  # compile and warm up, untimed
        while eng.has_unfinished_requests():
            eng.step()
        base = eng.stats().spec_decode or {}
        tokens, seconds = run(eng, params)
        c = eng.stats().spec_decode or {}
        drafted = c.get('num_draft_tokens', 0) - base.get('num_draft_tokens', 0)
        accepted = c.get('num_accepted_tokens', 0) - base.get('num_accepted_tokens', 0)
        if name == 'no drafts':
            control = tokens
        n = sum(len(t) for t in tokens)
        results[name] = dict(ms_per_token=1e3 * seconds / n, tokens=n, drafted=drafted, accepted=accepted,
                             acceptance=accepted / drafted if drafted else None, draft_graph_replays=len(replays),
                             same_tokens_as_no_drafts=(tokens == control) if params is greedy else None,
                             pool_free=eng.block_manager.num_free_blocks == eng.num_gpu_blocks)
        print(name, json.dumps(results[name]), flush=True)
        del eng
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    r = results
    checks = {
        'greedy tokens the control\'s': all(v['same_tokens_as_no_drafts'] in (True, None) for v in r.values()),
        'pools free': all(v['pool_free'] for v in r.values()),
        'graphs replayed': a.device == 'cpu' or r['own draft, draft graphs']['draft_graph_replays'] > 0,
        'acceptance eager = graphs': abs(r['own draft, eager draft']['acceptance']
                                         - r['own draft, draft graphs']['acceptance']) <= 0.02,
        'sampled guesses kept': r['own draft, sampled']['acceptance'] >= 0.9,
    }
    print('checks', json.dumps(checks), 'all passed' if all(checks.values()) else 'FAILED', flush=True)
    if a.out:
        with open(a.out, 'w') as f:
            device = torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'
            json.dump(dict(device=device, torch=torch.__version__, args=vars(a), runs=r, checks=checks), f, indent=1)


if __name__ == '__main__':
    main()
