#!/usr/bin/env python3
"""Real vLLM's n-gram speculative decoding on the prompts of `benchmarks/spec_decode.py`: the same token ids, the same
measures, so that the two engines' figures stand side by side.

  PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 python3 spec_vllm.py --model DIR --prompts PROMPTS.json --k 0
  ... --k 8 --out FILE.jsonl    # one engine per process: k = 0 is vLLM without speculation

PROMPTS.json is what `benchmarks/spec_decode.py --dump-prompts` writes: {"batch1": [[ids], ...], "batched": [[ids],
...], "max_tokens": N, "repeats": R,
"rounds": Q}. DIR: a Hugging Face folder of the model (its weights, config and tokenizer);
bfloat16 (--dtype), as paged-infer's benchmark runs it on a GPU. On a CPU, vLLM's CPU build (`cpu_venv.sh`) with
`--dtype float32` and `VLLM_CPU_KVCACHE_SPACE=GB`.
1. batch 1: each copy prompt alone, greedy, `max_tokens` at most (EOS ends it): mean milliseconds per output token
   (the request's whole time over its tokens), one untimed pass and the median of R timed passes;
2. the batched prompts at once, temperature 0.8, one seed each, `ignore_eos`: output tokens per second, the median of
   Q timed rounds after an untimed one.
Prints one JSON line (and appends it to --out).
"""
import argparse
import json
import os
import time

for k, v in dict(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', VLLM_NO_USAGE_STATS='1', DO_NOT_TRACK='1',
                 TOKENIZERS_PARALLELISM='false').items():
    os.environ.setdefault(k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--prompts', required=True)
    ap.add_argument('--k', type=int, default=0, help='num_speculative_tokens; 0: no speculation')
    ap.add_argument('--lookup', default='4,2', help='prompt_lookup_max,prompt_lookup_min')
    ap.add_argument('--max-model-len', type=int, default=2048)
    ap.add_argument('--gpu-memory-utilization', type=float, default=0.3)
    ap.add_argument('--dtype', default='bfloat16', help='float32 on a CPU, as paged-infer runs there')
    ap.add_argument('--load-format', default='auto',
                    help="'dummy': random weights (DIR then needs only config and tokenizer)")
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    w = json.load(open(a.prompts))
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    hi, lo = map(int, a.lookup.split(','))
    spec = None if not a.k else {'method': 'ngram', 'num_speculative_tokens': a.k, 'prompt_lookup_max': hi,
                                 'prompt_lookup_min': lo}
    t0 = time.perf_counter()
    batch1, batched = w.get('batch1', []), w.get('batched', [])  # (a file of one workload has no key of the other)
    llm = LLM(model=a.model, dtype=a.dtype, max_model_len=a.max_model_len, seed=0, speculative_config=spec,
              gpu_memory_utilization=a.gpu_memory_utilization, max_num_seqs=max(8, len(batched)),
              load_format=a.load_format)
    init_s = time.perf_counter() - t0
    med = lambda xs: sorted(xs)[len(xs) // 2]
    greedy = SamplingParams(temperature=0, max_tokens=w['max_tokens'])  # (detokenized, as paged-infer's answers are)
    passes, answers = [], []
    for rep in range(w['repeats'] + 1 if batch1 else 0):
        ms, answers = [], []
        for p in batch1:
            t1 = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=p)], greedy, use_tqdm=False)[0].outputs[0]
            ms.append((time.perf_counter() - t1) * 1e3 / len(out.token_ids))
            answers.append(list(out.token_ids))
        if rep:
            passes.append(sum(ms) / len(ms))
    rounds = []
    if batched:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in batched]
        for rep in range(w['rounds'] + 1):
            params = [SamplingParams(temperature=0.8, seed=i, max_tokens=w['max_tokens'], ignore_eos=True)
                      for i in range(len(prompts))]
            t1 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            rate = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t1)
            if rep:
                rounds.append(rate)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'
    res = dict(engine='vllm', vllm_version=vllm.__version__, torch=torch.__version__, device=device, dtype=a.dtype,
               k=a.k, lookup=[hi, lo], load_format=a.load_format, init_s=round(init_s, 1),
               batch1_ms_per_token=med(passes) if passes else None, batch1_passes=passes,
               batch1_output_tokens=sum(map(len, answers)), batch1_answers=answers,
               batched=len(batched), batched_output_tok_s=med(rounds) if rounds else None, batched_rounds=rounds,
               date=time.strftime('%Y-%m-%d'))
    line = json.dumps(res)
    print('RESULT', json.dumps({x: v for x, v in res.items() if x != 'batch1_answers'}), flush=True)
    if a.out:
        with open(a.out, 'a') as f:
            f.write(line + '\n')


if __name__ == '__main__':
    main()
