"""Speculative decoding on the GPU: n-gram drafts verified as decode rows through the CUDA graphs, token-identical.

    python tests/gpu/gpu_spec_check.py [--out DIR]   # writes DIR/gpu_spec_check.json

The real default model (SmolLM2-135M-Instruct) in float32 (near-ties are rare, and the attention kernels multiply
float32 exactly, chapter 15), copy-heavy and open chat prompts, greedy: against the same engine without drafts, and
beside Hugging Face float32 `generate` (counted, not asserted: near-ties may fall otherwise on the GPU).
Engine runs with drafts: CUDA graphs (the default), eager, a pool small enough to preempt by swap and by recompute,
chunked prefill with a small budget, prefix caching with a shared system prompt. Each must give those tokens, accept
drafts, and leave its pool all free; with graphs, the verify steps must replay graphs (counted). Then a draft model
(chapter 13e): the target as its own draft, with graphs, swap preemption and prefix hits, must also accept 95% of its
drafts or more (its cache held the right keys and values).
"""
import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.model.default_model import prepare_default_model

N = 48
ASKS = ['Repeat this passage exactly, word for word:\n\nThe river rose slowly through the night. By morning the lower '
        'fields were under water, and the farmers moved their cattle to the hill behind the church.',
        'Copy this list as it is:\n1. apples\n2. pears\n3. plums\n4. cherries\n5. grapes',
        'What is the capital of France?', 'Write a short haiku about memory.']
SYSTEM = 'You are a careful copy editor. When asked to repeat a text, you repeat it exactly and add nothing else.'
SPEC = {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 3, 'prompt_lookup_min': 1,
        'disable_when_slower': False}
RUNS = {  # name: (prompts, engine settings); a 'no drafts' run is the control of the runs on its prompts after it
    'no drafts': ('plain', dict(speculative_config=None)),
    'graphs': ('plain', {}),
    'eager': ('plain', dict(enforce_eager=True)),
    'swap': ('plain', dict(num_gpu_blocks=16, preemption_mode='swap', num_cpu_blocks=64)),
    'recompute': ('plain', dict(num_gpu_blocks=16, preemption_mode='recompute')),
    'chunked': ('plain', dict(enable_chunked_prefill=True, max_num_batched_tokens=32)),
    'no drafts, shared prefix': ('prefixed', dict(speculative_config=None)),
    'prefix': ('prefixed', {}),
    # a draft model (chapter 13e): the target as its own draft, so that (almost) every draft is accepted if and only if
    # the draft's cache is right
    'draft model, graphs': ('plain', dict(speculative_config='draft')),
    'draft model, swap': ('plain', dict(speculative_config='draft', num_gpu_blocks=16, preemption_mode='swap',
                                        num_cpu_blocks=64)),
    'draft model, shared prefix': ('prefixed', dict(speculative_config='draft')),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', default='.')
    ap.add_argument('--device', default='cuda', help='cpu: a smoke test of the script (no graphs)')
    a = ap.parse_args()
    folder = prepare_default_model()
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(a.device).eval()
    probe = LLMEngine(num_gpu_blocks=8, device=a.device, dtype='float32', enforce_eager=True)
    tok = probe.tokenizer
    del probe
    chat = lambda q, sys=None: tok.apply_chat_template(([{'role': 'system', 'content': sys}] if sys else []) +
                                                       [{'role': 'user', 'content': q}], add_generation_prompt=True,
                                                       tokenize=True, return_dict=False)
    sets = {'plain': [chat(q) for q in ASKS], 'prefixed': [chat(q, SYSTEM) for q in ASKS]}

    def ref(p):
        out = hf.generate(torch.tensor([p], device=a.device), max_new_tokens=N, do_sample=False,
                          pad_token_id=tok.eos_token_id)[0, len(p):].tolist()
        return out[: out.index(tok.eos_token_id) + 1] if tok.eos_token_id in out else out

    refs = {k: [ref(p) for p in v] for k, v in sets.items()}
    results, ok = {}, True
    control = {}
    draft = {'model': str(folder), 'num_speculative_tokens': 4}
    for name, (which, kw) in RUNS.items():
        if kw.get('speculative_config') == 'draft':
            kw = kw | {'speculative_config': draft}
        t0 = time.perf_counter()
        eng = LLMEngine(device=a.device, dtype='float32', max_num_seqs=16,
                        **({'num_gpu_blocks': 256, 'speculative_config': SPEC} | kw))
        graph_rows = []
        if eng.runner.graphs is not None:
            run_graph = eng.runner.graphs.run
            eng.runner.graphs.run = lambda ids, *r, **k: graph_rows.append(len(ids)) or run_graph(ids, *r, **k)
        prompts = sets[which]
        ids = []
        for i, p in enumerate(prompts):
            ids.append(eng.add_request(p, SamplingParams(temperature=0, max_tokens=N)))
            if which == 'prefixed' and i == 0:  # its prompt cached before the others come
                eng.step()
        done = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = o.outputs[0].token_ids
        got = [done[r] for r in ids]
        want = refs[which]
        c = eng.stats().spec_decode or {'num_accepted_tokens': 0}
        if name.startswith('no drafts'):
            control[which] = got
        diffs = [next((i for i, (x, y) in enumerate(zip(g, w)) if x != y), None) for g, w in zip(got, want)]
        same_as_control = sum(g == w for g, w in zip(got, control[which]))
        free = eng.block_manager.num_free_blocks == eng.num_gpu_blocks
        verify_graphs = sum(n > len(prompts) for n in graph_rows)  # more rows than requests: drafts in the graph
        same = sum(g == w for g, w in zip(got, want))
        # the test: the same tokens as the engine without drafts (which HF's are, unless a near-tie in float32 falls
        # otherwise on the GPU: reported beside)
        passed = same_as_control == len(want) and free and (c['num_accepted_tokens'] > 0 or 'no drafts' in name)
        passed = passed and (name not in ('graphs', 'prefix') or a.device == 'cpu' or verify_graphs > 0)
        if name.startswith('draft model'):
            passed = passed and c['num_accepted_tokens'] >= 0.95 * c['num_draft_tokens']
        ok &= passed
        results[name] = dict(identical=f'{same}/{len(want)}', same_as_no_drafts=f'{same_as_control}/{len(want)}',
                             first_diff_from_hf=diffs, tokens=got, hf=want, pool_free=free, spec=c, graph_replays=len(graph_rows),
                             graph_replays_with_drafts=verify_graphs, preemptions=eng.scheduler.num_preemptions,
                             prefix_hits=eng.block_manager.prefix_hits, passed=passed,
                             s=round(time.perf_counter() - t0, 1))
        print(name, json.dumps({k: v for k, v in results[name].items() if k not in ('tokens', 'hf')}), flush=True)
        del eng
        if a.device == 'cuda':
            torch.cuda.empty_cache()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    info = dict(device=torch.cuda.get_device_name() if a.device == 'cuda' else a.device, torch=torch.__version__, date=time.strftime('%Y-%m-%d'))
    (Path(a.out) / 'gpu_spec_check.json').write_text(json.dumps(dict(machine=info, runs=results), indent=1))
    raise SystemExit(0 if ok else 1)


if __name__ == '__main__':
    main()
