"""Speculative decoding measured on the real default model (SmolLM2-135M-Instruct): n-gram drafts against none.

    python benchmarks/spec_decode.py --out FILE.json [--device cuda|cpu] [--ks 2,4,6,8] [--batch 64] [--max-tokens 256]
        [--repeats 3] [--rounds 9] [--dump-prompts PROMPTS.json] [--no-batch1] [--watch]
        [--model DIR [--load-format dummy] | --shape Llama-3.1-8B [--tokenizer DIR]]

Two workloads, each with the same engine settings with and without `speculative_config`:
1. batch 1, copy-heavy (chat prompts that ask to repeat or lightly edit a passage, greedy): milliseconds per output
   token (end to end, the prompt's prefill included), one request at a time; for each k in --ks.
2. batch --batch, open-ended questions (sampled at temperature 0.8 with seeds, `ignore_eos`, --max-tokens each: the
   same number of tokens with and without drafts): output tokens per second of the whole batch, where drafts are
   rarely accepted; speculation must pause itself there (`SpeculativeConfig.disable_when_slower`, chapter 13d). Each
   round's ratio (drafts / none) is reported too, and its median: the rounds of one engine spread more than the 3%
   that matters, and rounds next to each other share the machine's state. --watch times every step and the pause
   rule (`Speculator.active`): how many steps it chose drafting and its share of the step time.
The engine's own defaults otherwise (on a GPU: CUDA graphs, async scheduling for the plain steps). The engines live side
by side (a fixed pool each); each pass (round) goes through all of them in turn (batched: in alternating order), the
first untimed, and the median of the timed ones (--repeats passes at batch 1, --rounds rounds batched) is reported.
--dump-prompts writes the prompts' token ids for real vLLM's run of the same workloads (`benchmarks/peer/spec_vllm.py`).
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
    'def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n'
    '        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n'
    '        else:\n            out.append(b[j])\n            j += 1\n'
    '    return out + a[i:] + b[j:]\n',
    'Meeting notes: the team agreed to ship the new scheduler on Monday. Alice owns the rollout, Bob writes the '
    'migration guide, and Carol checks the dashboards twice a day for the first week.',
]
PASSAGES = [p + '\n\n' + q for p, q in zip(PASSAGES, PASSAGES[1:] + PASSAGES[:1])]  # two each: longer copies
ASKS = ['Repeat this passage exactly, word for word:\n\n{}',
        'Rewrite this text with every sentence on its own line, changing nothing else:\n\n{}']
TOPICS = ['a lighthouse keeper', 'the history of bread', 'a robot learning to paint', 'why the sky is blue',
          'a city under the sea', 'the first day at a new school', 'how bees find flowers', 'a lost umbrella']
OPEN_ASKS = [f'Write a short story about {t}.' for t in TOPICS] + [f'Explain {t} to a child.' for t in TOPICS]


def chat(tok, text: str) -> list:
    return tok.apply_chat_template([{'role': 'user', 'content': text}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def engine(args, spec):
    "An engine of a fixed pool (several live side by side), max_num_seqs >= the batch."
    return LLMEngine(model=args.model, device=args.device, max_num_seqs=max(args.batch, 8), num_gpu_blocks=args.blocks,
                     speculative_config=spec, load_format=args.load_format)


def drain(eng) -> dict:
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    if eng.runner.device.type == 'cuda':
        torch.cuda.synchronize()
    return done


def batch1_pass(eng, prompts, max_tokens) -> tuple:
    "One pass over the copy prompts, one at a time: (mean ms per output token, tokens of each answer)."
    ms, answers = [], []
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        eng.add_request(p, SamplingParams(temperature=0, max_tokens=max_tokens), f'b1-{i}')
        out = drain(eng)[f'b1-{i}'].outputs[0]
        ms.append((time.perf_counter() - t0) * 1e3 / len(out.token_ids))
        answers.append(out.token_ids)
    return sum(ms) / len(ms), answers


def batched_round(eng, prompts, max_tokens, r: int) -> float:
    "Output tokens per second of all `prompts` at once, sampled (seeded), every answer `max_tokens` long."
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0.8, seed=i, max_tokens=max_tokens, ignore_eos=True)
        eng.add_request(p, params, f'r{r}-{i}')
    done = drain(eng)
    return sum(len(o.outputs[0].token_ids) for o in done.values()) / (time.perf_counter() - t0)


def acceptance(eng):
    s = eng.stats().spec_decode
    return s['num_accepted_tokens'] / s['num_draft_tokens'] if s and s['num_draft_tokens'] else None


def batch1(args, engines: dict, prompts: list, res: dict):
    "Every engine once per pass over the copy prompts, passes interleaved, the first untimed; results into `res`."
    med = lambda xs: sorted(xs)[len(xs) // 2]
    passes, answers = {name: [] for name in engines}, {}
    for rep in range(args.repeats + 1):
        for name, eng in engines.items():
            ms, answers[name] = batch1_pass(eng, prompts, args.max_tokens)
            if rep:
                passes[name].append(ms)
    base = med(passes['none'])
    for name, eng in engines.items():
        r = dict(ms_per_token=med(passes[name]), passes=passes[name], speedup=base / med(passes[name]),
                 acceptance=acceptance(eng), same_tokens=answers[name] == answers['none'],
                 output_tokens=sum(map(len, answers[name])), answers=answers[name])
        res['batch1'][name] = r
        acc = '' if r['acceptance'] is None else f', acceptance {r["acceptance"]:.0%}'
        times = [round(x, 3) for x in passes[name]]
        print(f'batch 1, copy-heavy, {name}: {r["ms_per_token"]:.3f} ms/token (passes {times}), '
              f'{r["speedup"]:.2f}x{acc}, same tokens: {r["same_tokens"]}', flush=True)


def watch(eng, log: dict):
    "Record each step's seconds of `eng` in log['steps'] and, where it has a speculator, the rule's choice and time."
    log.update(steps=[], rule=[], drafting=0, drafting_by_bits={})
    step, sp = eng.step, eng.speculator

    def timed_step():
        t0 = time.perf_counter()
        out = step()
        log['steps'].append(time.perf_counter() - t0)
        return out

    eng.step = timed_step
    if sp is None:
        return
    rule = sp.active

    def timed_rule(running):
        t0 = time.perf_counter()
        want = rule(running)
        log['rule'].append(time.perf_counter() - t0)
        log['drafting'] += want
        if want:  # by the running batch's bit length (batch 64-127: 7)
            bits = len(running).bit_length()
            log['drafting_by_bits'][bits] = log['drafting_by_bits'].get(bits, 0) + 1
        return want

    sp.active = timed_rule


def batched(args, engines: dict, prompts: list, res: dict):
    """Every engine once per round, the order alternating (ABBA: drift falls on both alike), the first round untimed;
    the median of each engine's rounds and the median of the rounds' ratios (drafts / none), into `res`."""
    med = lambda xs: sorted(xs)[len(xs) // 2]
    logs = {name: {} for name in engines}
    if args.watch:
        for name, eng in engines.items():
            watch(eng, logs[name])
    rounds = {name: [] for name in engines}
    for rep in range(args.rounds + 1):
        order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
        for name in order:
            rate = batched_round(engines[name], prompts, args.max_tokens, rep)
            if rep:
                rounds[name].append(rate)
    base = med(rounds['none'])
    for name, eng in engines.items():
        ratios = [x / y for x, y in zip(rounds[name], rounds['none'])]
        r = dict(output_tok_s=med(rounds[name]), rounds=rounds[name], ratio=med(rounds[name]) / base,
                 paired_ratio=med(ratios), acceptance=acceptance(eng),
                 drafts=(eng.stats().spec_decode or {}).get('num_drafts', 0))
        line = (f'batch {args.batch}, open-ended, {name}: {r["output_tok_s"]:.0f} out tok/s (rounds '
                f'{[round(x) for x in rounds[name]]}), {r["ratio"]:.3f}x, median round ratio {r["paired_ratio"]:.3f}x, '
                f'{r["drafts"]} drafts')
        if args.watch:
            log = logs[name]
            r['median_step_ms'] = med(log['steps']) * 1e3
            r['steps'] = len(log['steps'])
            line += f', {r["steps"]} steps, median step {r["median_step_ms"]:.3f} ms'
            if log['rule']:
                r['drafting_steps'] = log['drafting']
                r['drafting_steps_by_bit_length'] = log['drafting_by_bits']
                r['gain'] = eng.speculator.gain
                r['rule_share'] = sum(log['rule']) / sum(log['steps'])
                r['rule_median_us'] = med(log['rule']) * 1e6
                r['step_seconds_held'] = [{b: t * 1e3 for b, t in m.items()} for m in eng.speculator.seconds]
                line += (f'; the rule chose drafting in {log["drafting"]} steps (by batch bit length '
                         f'{log["drafting_by_bits"]}; gain at the end {r["gain"]:.3f}), took {r["rule_share"]:.2%} of the '
                         f'step time (median {r["rule_median_us"]:.0f} us), ms held by batch bit length (plain, '
                         f'drafting): {r["step_seconds_held"]}')
        res['batched'][name] = r
        print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', default=None, help='default: the default model')
    ap.add_argument('--shape', default=None, help='instead of --model: random weights of this shape (bench SHAPES)')
    ap.add_argument('--tokenizer', default=None, help="--shape: tokenizer folder (default: the default model's)")
    ap.add_argument('--load-format', default='auto', help='dummy: random weights (drafts then are rarely accepted)')
    ap.add_argument('--no-batch1', action='store_true', help='only the batched workload')
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--ks', default='2,4,6,8')
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--max-tokens', type=int, default=256)
    ap.add_argument('--repeats', type=int, default=3, help='timed passes at batch 1, after one untimed')
    ap.add_argument('--rounds', type=int, default=9, help='timed rounds of the batched workload, after one untimed')
    ap.add_argument('--watch', action='store_true', help="batched: time every step, and the pause rule's choices")
    ap.add_argument('--blocks', type=int, default=4096, help='KV blocks of each engine')
    ap.add_argument('--lookup', default='4,2', help='prompt_lookup_max,prompt_lookup_min')
    ap.add_argument('--out', default=None)
    ap.add_argument('--dump-prompts', default=None, help="write the prompts' token ids here (for spec_vllm.py)")
    args = ap.parse_args()
    if args.repeats < 1 or args.rounds < 1:
        ap.error('--repeats and --rounds: 1 or more')
    if args.shape:
        from paged_infer.bench.workloads import make_random_model
        folder = make_random_model(args.shape, tokenizer_folder=args.tokenizer, weights=False)
        args.model, args.load_format = str(folder), 'dummy'
    hi, lo = map(int, args.lookup.split(','))
    spec = lambda k: {'method': 'ngram', 'num_speculative_tokens': k, 'prompt_lookup_max': hi, 'prompt_lookup_min': lo}
    res = dict(machine=dict(device=torch.cuda.get_device_name() if args.device == 'cuda' else platform.processor(),
                            torch=torch.__version__, threads=torch.get_num_threads()),
               date=time.strftime('%Y-%m-%d'), args=vars(args), batch1={}, batched={})
    ks = [int(k) for k in args.ks.split(',')]
    prompts = dict(max_tokens=args.max_tokens, repeats=args.repeats, rounds=args.rounds)
    # 1. batch 1: passes interleaved (drift falls on all engines alike)
    if not args.no_batch1:
        engines = {'none': engine(args, None)} | {f'k={k}': engine(args, spec(k)) for k in ks}
        tok = engines['none'].tokenizer
        prompts['batch1'] = [chat(tok, a.format(p)) for a in ASKS for p in PASSAGES]
        batch1(args, engines, prompts['batch1'], res)
        del engines
    # 2. --batch open-ended requests at once
    if args.batch:
        k = 4 if 4 in ks else ks[0]
        engines = {'none': engine(args, None), f'k={k}': engine(args, spec(k))}
        tok = engines['none'].tokenizer
        prompts['batched'] = [chat(tok, OPEN_ASKS[i % len(OPEN_ASKS)]) for i in range(args.batch)]
        batched(args, engines, prompts['batched'], res)
    if args.dump_prompts:
        with open(args.dump_prompts, 'w') as f:
            json.dump(prompts, f)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(res, f, indent=1)


if __name__ == '__main__':
    main()
