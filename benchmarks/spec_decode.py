"""Speculative decoding measured on the real default model (SmolLM2-135M-Instruct): n-gram drafts against none.

    python benchmarks/spec_decode.py --out FILE.json [--device cuda|cpu] [--ks 2,4,6,8] [--batch 64] [--max-tokens 160]

Two workloads, each with the same engine settings with and without `speculative_config`:
1. batch 1, copy-heavy (chat prompts that ask to repeat or lightly edit a passage, greedy): milliseconds per output
   token, one request at a time, after a warm-up request; for each k in --ks.
2. batch --batch, open-ended questions (sampled at temperature 0.8 with seeds, `ignore_eos`, --max-tokens each: the
   same number of tokens with and without drafts): output tokens per second of the whole batch, where drafts are
   rarely accepted; speculation must pause itself there (SpeculativeConfig.min_gain).
The engine's own defaults otherwise (on a GPU: CUDA graphs, async scheduling for the plain steps).
"""
import argparse
import json
import platform
import time

import torch

from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams

PASSAGES = [
    'A paged KV cache keeps the keys and values of each sequence in blocks of sixteen tokens. A block table maps the '
    'positions of a sequence to the blocks of one shared pool, so that no memory is reserved for tokens that never '
    'come, and two sequences that share a prompt can share its blocks until one of them writes.',
    'The river rose slowly through the night. By morning the lower fields were under water, and the farmers moved '
    'their cattle to the hill behind the church, where the grass was thin but the ground was dry.',
    'def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n'
    '            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n'
    '    return out + a[i:] + b[j:]\n',
    'Meeting notes: the team agreed to ship the new scheduler on Monday. Alice owns the rollout, Bob writes the '
    'migration guide, and Carol checks the dashboards twice a day for the first week.',
]
PASSAGES = [p + '\n\n' + q for p, q in zip(PASSAGES, PASSAGES[1:] + PASSAGES[:1])]  # two each: longer copies
ASKS = ['Repeat this passage exactly, word for word:\n\n{}',
        'Rewrite this text with every sentence on its own line, changing nothing else:\n\n{}']
TOPICS = ['a lighthouse keeper', 'the history of bread', 'a robot learning to paint', 'why the sky is blue',
          'a city under the sea', 'the first day at a new school', 'how bees find flowers', 'a lost umbrella']


def chat(tok, text: str) -> list:
    return tok.apply_chat_template([{'role': 'user', 'content': text}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def engine(args, spec):
    return LLMEngine(model=args.model, device=args.device, max_num_seqs=max(args.batch, 8), speculative_config=spec)


def drain(eng) -> dict:
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    return done


def batch1(args, spec) -> dict:
    "Milliseconds per output token, each copy prompt alone, greedy; the acceptance rate of the drafts."
    eng = engine(args, spec)
    prompts = [chat(eng.tokenizer, a.format(p)) for a in ASKS for p in PASSAGES]
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    eng.add_request(prompts[0], SamplingParams(temperature=0, max_tokens=16), 'warm-up')
    drain(eng)
    before = eng.stats().spec_decode or {}
    ms, tokens, texts = [], 0, []
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        eng.add_request(p, greedy, str(i))
        out = drain(eng)[str(i)].outputs[0]
        if args.device == 'cuda':
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        ms.append(dt * 1e3 / len(out.token_ids))
        tokens += len(out.token_ids)
        texts.append(out.token_ids)
    after = eng.stats().spec_decode or {}
    drafted = after.get('num_draft_tokens', 0) - before.get('num_draft_tokens', 0)
    accepted = after.get('num_accepted_tokens', 0) - before.get('num_accepted_tokens', 0)
    return dict(ms_per_token=sum(ms) / len(ms), per_prompt_ms=ms, output_tokens=tokens,
                acceptance=accepted / drafted if drafted else None, token_ids=texts)


def batched(args, spec) -> dict:
    "Output tokens per second of --batch open-ended requests at once, sampled, all of --max-tokens tokens."
    eng = engine(args, spec)
    asks = [f'Write a short story about {t}.' for t in TOPICS] + [f'Explain {t} to a child.' for t in TOPICS]
    prompts = [chat(eng.tokenizer, asks[i % len(asks)]) for i in range(args.batch)]
    eng.add_request(prompts[0], SamplingParams(temperature=0, max_tokens=16), 'warm-up')
    drain(eng)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add_request(p, SamplingParams(temperature=0.8, seed=i, max_tokens=args.max_tokens, ignore_eos=True), str(i))
    done = drain(eng)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in done.values())
    s = eng.stats().spec_decode or {}
    return dict(output_tokens=n, seconds=dt, output_tok_s=n / dt, drafts=s.get('num_drafts', 0),
                acceptance=s['num_accepted_tokens'] / s['num_draft_tokens'] if s.get('num_draft_tokens') else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', default=None, help='default: the default model')
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--ks', default='2,4,6,8')
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--max-tokens', type=int, default=256)
    ap.add_argument('--lookup', default='4,2', help='prompt_lookup_max,prompt_lookup_min')
    ap.add_argument('--out', default=None)
    args = ap.parse_args()
    hi, lo = map(int, args.lookup.split(','))
    spec = lambda k: {'method': 'ngram', 'num_speculative_tokens': k, 'prompt_lookup_max': hi, 'prompt_lookup_min': lo}
    res = dict(machine=dict(device=torch.cuda.get_device_name() if args.device == 'cuda' else platform.processor(),
                            torch=torch.__version__, threads=torch.get_num_threads()),
               date=time.strftime('%Y-%m-%d'), args=vars(args), batch1={}, batched={})
    base = batch1(args, None)
    res['batch1']['none'] = base
    print(f'batch 1, copy-heavy: no drafts {base["ms_per_token"]:.2f} ms/token', flush=True)
    for k in map(int, args.ks.split(',')):
        r = batch1(args, spec(k))
        r['same_tokens'] = r['token_ids'] == base['token_ids']
        r['speedup'] = base['ms_per_token'] / r['ms_per_token']
        res['batch1'][f'k={k}'] = r
        print(f'  k={k}: {r["ms_per_token"]:.2f} ms/token, {r["speedup"]:.2f}x, acceptance {r["acceptance"]:.0%}, '
              f'same tokens: {r["same_tokens"]}', flush=True)
    for r in res['batch1'].values():
        del r['token_ids']
    if args.batch:
        k = 4 if '4' in args.ks.split(',') else int(args.ks.split(',')[0])
        plain, fast = batched(args, None), batched(args, spec(k))
        fast['ratio'] = fast['output_tok_s'] / plain['output_tok_s']
        res['batched'] = {'none': plain, f'k={k}': fast}
        acc = 'n/a' if fast['acceptance'] is None else f'{fast["acceptance"]:.0%}'
        print(f'batch {args.batch}, open-ended: {plain["output_tok_s"]:.0f} out tok/s without, '
              f'{fast["output_tok_s"]:.0f} with k={k} ({fast["ratio"]:.3f}x; {fast["drafts"]} drafts, acceptance {acc})')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(res, f, indent=1)


if __name__ == '__main__':
    main()
