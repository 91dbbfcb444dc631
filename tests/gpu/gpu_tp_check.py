"""Tensor parallelism on two GPUs (NCCL): greedy parity of 2 ranks against 1 rank and Hugging Face.

    python tests/gpu/gpu_tp_check.py [--parts tiny,8b] [--assets DIR] [--out DIR]   # two GPUs; writes DIR/gpu_tp_check.json

1. tiny: chapter 18's two small shapes (Llama-like, 8 heads over 2 KV heads, llama3 rope; Qwen2-like, 4 heads over 1
   KV head replicated, qkv bias, tied, odd vocabulary), float32 on cuda: TP=1, TP=2 and HF `generate`, 4 prompts x 12
   greedy tokens: token-identical (as chapter 18's CPU test over gloo, here over NCCL and the Triton kernels).
   Then TP=2 with CUDA graphs on both ranks, with async scheduling and with multi-step scheduling (4 steps a
   launch), each against TP=1.
2. 8b: a random-weight Llama-3.1-8B-shaped model (bf16 folder, `make_random_model`, reused by the throughput runs).
   a. float32 (the bf16 weights, upcast, so the same model): HF fp32 `generate` against TP=1 and TP=2, the latter
      also with a pool small enough to preempt by swapping, with chunked prefill (64-token budget), and with CUDA
      graphs on both ranks, alone and with async and multi-step scheduling: 8 prompts of 24-300 random tokens x 32
      greedy tokens. In float32 near-ties are rare, so tokens should agree.
   b. bfloat16: HF bf16 `generate` against TP=1 (eager, CUDA graphs) and TP=2 (eager, graphs, graphs with async
      scheduling). Random weights give flat logits, so bf16 paths part at near-ties; as in gpu_parity.py the measure
      is teacher-forced: along each run's own output, the log-probability it reported against a float32 copy's, max
      abs error, beside HF bf16's own error on the same sequences. TP=2 no worse than TP=1 and HF means the split adds
      nothing beyond bf16 rounding.
Every engine run checks that its pool is all free at the end. Results go to gpu_tp_check.json as they come; the
script exits with an error if a token check of part 1 fails.
"""
import argparse, json, shutil, tempfile, time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from paged_infer.bench.workloads import make_random_model
from paged_infer.core.engine import LLMEngine
from paged_infer.model.default_model import prepare_default_model
from paged_infer.core.sampling_params import SamplingParams

ROWS = []
FAILED = []
TP2_MODES = {'graphs': dict(eager=False), 'graphs async': dict(eager=False, async_scheduling=True),
             'graphs multi-step 4': dict(eager=False, num_scheduler_steps=4),
             'graphs async multi-step 4': dict(eager=False, async_scheduling=True, num_scheduler_steps=4),
             'eager async multi-step 4': dict(async_scheduling=True, num_scheduler_steps=4)}


def check(ok: bool, what: str):
    "Note a failed check (the script exits with an error at the end)."
    if not ok:
        FAILED.append(what)
        print('FAILED:', what, flush=True)


def emit(out, row):
    print(json.dumps({k: v for k, v in row.items() if k not in ('tokens', 'logprobs')}), flush=True)
    ROWS.append({k: v for k, v in row.items() if k not in ('tokens', 'logprobs')})
    Path(out, 'gpu_tp_check.json').write_text(json.dumps(ROWS, indent=1))


def run_engine(folder, prompts, n, dtype, tp, eager=True, **kw):
    "Greedy tokens and their reported log-probabilities from one engine; its pool must come back all free."
    t0 = time.perf_counter()
    eng = LLMEngine(model=str(folder), dtype=dtype, device='cuda', tensor_parallel_size=tp, max_num_seqs=16,
                    enforce_eager=eager, **({'num_gpu_blocks': 1024} | kw))
    try:
        t1 = time.perf_counter()
        ids = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=0)) for p in prompts]
        done = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished: done[o.request_id] = o.outputs[0]
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks, 'blocks leaked'
        toks = [done[i].token_ids for i in ids]
        lps = [[d[t] for d, t in zip(done[i].logprobs, done[i].token_ids)] for i in ids]
        return toks, lps, dict(load_s=round(t1 - t0, 1), run_s=round(t2 - t1, 2), preemptions=eng.scheduler.num_preemptions,
                               graphs=bool(eng.runner.graphs))
    finally:
        eng.shutdown(); del eng; torch.cuda.empty_cache()


@torch.inference_mode()
def hf_greedy(model, prompts, n):
    dev = model.device
    return [model.generate(torch.tensor([p], device=dev), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]


@torch.inference_mode()
def token_logprobs(model, seq, start):
    "log p(seq[i] | seq[:i]) for i >= start, float32, one teacher-forced forward."
    logits = model(torch.tensor([seq], device=model.device)).logits[0, start - 1:-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(seq[start:], device=model.device)[:, None])[:, 0].cpu()


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def tiny(a):
    shapes = {
        'llama, 8 heads over 2 KV heads': LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
            rope_parameters=dict(rope_type='llama3', rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=256)),
        'qwen2, 4 heads over 1 KV head': Qwen2Config(vocab_size=49153, hidden_size=96, intermediate_size=192, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True),
    }
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 49152, (int(n),), generator=g).tolist() for n in (5, 17, 40, 3)]
    for name, cfg in shapes.items():
        torch.manual_seed(1)
        hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        folder = Path(tempfile.mkdtemp()) / 'model'
        hf.save_pretrained(folder)
        for f in Path(a.assets).glob('tokenizer*'): shutil.copy(f, folder / f.name)
        ref = hf_greedy(hf.cuda().eval(), prompts, 12)
        del hf
        one, _, i1 = run_engine(folder, prompts, 12, 'float32', 1, num_gpu_blocks=64, enable_prefix_caching=False)
        two, _, i2 = run_engine(folder, prompts, 12, 'float32', 2, num_gpu_blocks=64, enable_prefix_caching=False)
        emit(a.out, dict(part='tiny', shape=name, dtype='float32', tp1_eq_hf=one == ref, tp2_eq_hf=two == ref, tp2_eq_tp1=two == one,
                         tp1=i1, tp2=i2))
        check(one == ref and two == ref, f'tiny {name}: TP=1 or TP=2 eager parts from HF')
        for mode, kw in TP2_MODES.items():  # CUDA graphs on both ranks, async and multi-step scheduling
            got, _, info = run_engine(folder, prompts, 12, 'float32', 2, num_gpu_blocks=64, enable_prefix_caching=False, **kw)
            emit(a.out, dict(part='tiny', shape=name, dtype='float32', run=f'tp2 {mode}', tp2_eq_tp1=got == one, **info))
            check(got == one, f'tiny {name}: TP=2 {mode} parts from TP=1')
        shutil.rmtree(folder.parent)


def eight_b(a):
    t0 = time.perf_counter()
    folder = make_random_model('llama-3.1-8b', tokenizer_folder=a.assets, dtype='bfloat16', max_model_len=8192, seed=0, device='cuda')
    print(f'8B folder ready in {time.perf_counter() - t0:.0f} s: {folder}', flush=True)
    V, N = 128256, 32
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, V, (int(n),), generator=g).tolist() for n in torch.randint(24, 300, (8,), generator=g)]
    runs = {}  # name -> (dtype, tokens, logprobs, info)
    plan = [('fp32 tp1', 'float32', 1, True, {}), ('fp32 tp2', 'float32', 2, True, {}),
            ('fp32 tp2 preempt-swap', 'float32', 2, True, dict(num_gpu_blocks=40, num_cpu_blocks=256, preemption_mode='swap')),
            ('fp32 tp2 chunked', 'float32', 2, True, dict(max_num_batched_tokens=64)),
            ('bf16 tp1 eager', 'bfloat16', 1, True, {}), ('bf16 tp1 graphs', 'bfloat16', 1, False, {}),
            ('bf16 tp2', 'bfloat16', 2, True, {}), ('fp32 tp2 graphs', 'float32', 2, False, {}),
            ('fp32 tp2 graphs async multi-step 4', 'float32', 2, False, dict(async_scheduling=True, num_scheduler_steps=4)),
            ('bf16 tp2 graphs', 'bfloat16', 2, False, {}), ('bf16 tp2 graphs async', 'bfloat16', 2, False, dict(async_scheduling=True))]
    if a.runs: plan = [r for r in plan if r[0] in a.runs.split(',') or r[0] == 'bf16 tp1 eager']
    for name, dtype, tp, eager, kw in plan:
        toks, lps, info = run_engine(folder, prompts, N, dtype, tp, eager, **kw)
        runs[name] = (dtype, toks, lps, info)
        print(name, info, flush=True)
    # float32: HF generate on GPU 0, token identity
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to('cuda:0').eval()
    ref_out = hf_greedy(ref, prompts, N)
    for name, (dtype, toks, lps, info) in runs.items():
        if dtype != 'float32': continue
        diffs = [first_diff(t, r) for t, r in zip(toks, ref_out)]
        err = max(float((torch.tensor(lp) - token_logprobs(ref, p + t, len(p))).abs().max()) for p, t, lp in zip(prompts, toks, lps))
        emit(a.out, dict(part='8b', run=name, identical_to_hf_fp32=f'{sum(d is None for d in diffs)}/8', first_diffs=diffs,
                         max_logprob_err_vs_fp32=err, **info))
    # bfloat16: HF bf16 on GPU 1; errors against the float32 copy (GPU 0), teacher-forced along each run's own output
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to('cuda:1').eval()
    hf_out = hf_greedy(hf, prompts, N)
    base = runs['bf16 tp1 eager'][1]
    for name, (dtype, toks, lps, info) in runs.items():
        if dtype != 'bfloat16': continue
        ours_err = hf_err = 0.0
        gaps = []
        for p, t, lp, h in zip(prompts, toks, lps, hf_out):
            r = token_logprobs(ref, p + t, len(p))
            ours_err = max(ours_err, float((torch.tensor(lp) - r).abs().max()))
            hf_err = max(hf_err, float((token_logprobs(hf, p + t, len(p)) - r).abs().max()))
            k = first_diff(t, h)
            if k is not None:
                with torch.inference_mode(): rl = ref(torch.tensor([p + t[:k]], device='cuda:0')).logits[0, -1].float()
                gaps.append(dict(pos=k, fp32_logit_ours_minus_hf=round(float(rl[t[k]] - rl[h[k]]), 4)))
        emit(a.out, dict(part='8b', run=name, identical_to_hf_bf16=f'{sum(x == y for x, y in zip(toks, hf_out))}/8',
                         identical_to_bf16_tp1_eager=f'{sum(x == y for x, y in zip(toks, base))}/8',
                         ours_vs_fp32_max_logprob_err=ours_err, hf_bf16_vs_fp32_max_logprob_err=hf_err,
                         first_divergences_from_hf=gaps, **info))


def main():
    ap = argparse.ArgumentParser(description='Tensor parallelism on two GPUs: greedy parity against one rank and HF.')
    ap.add_argument('--assets', default=None, help='a folder with the tokenizer (and config.json) to use (default: the default model\'s, converted under ~/.cache/paged-infer on first use)')
    ap.add_argument('--out', default='.', help='results folder (default: the current directory)')
    ap.add_argument('--parts', default='tiny,8b')
    ap.add_argument('--runs', default='', help="8b: only these runs (names as in the plan, comma-separated; 'bf16 tp1 eager' always)")
    a = ap.parse_args()
    a.assets = a.assets or str(prepare_default_model())
    Path(a.out).mkdir(parents=True, exist_ok=True)
    print(f'{torch.cuda.device_count()} GPUs: {torch.cuda.get_device_name(0)}; torch {torch.__version__}', flush=True)
    if 'tiny' in a.parts: tiny(a)
    if '8b' in a.parts: eight_b(a)
    if FAILED:
        raise SystemExit(f'{len(FAILED)} checks failed: ' + '; '.join(FAILED))


if __name__ == '__main__':
    main()
