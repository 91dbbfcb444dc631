"""Structured outputs and forced tool calls on the GPU: the grammar's token mask applied on the device, in a batch.

    python tests/gpu/gpu_structured_check.py [--assets DIR] [--out DIR]   # writes DIR/gpu_structured_check.json

A random-weight model of the SmolLM2-135M shape (bf16, its tokenizer from `--assets`): whatever the weights, an
answer under a grammar must be what the grammar allows, so random weights are a harsh test (they would write
anything). One batch through the engine on the GPU, sampled (temperature 1, seeded): unconstrained requests beside a
choice, a regex, a JSON schema without free whitespace (n=3), any JSON object, a Lark grammar and a forced tool call
(tool_choice required, chapter 16e's grammar); each constrained answer that finished is checked against its
constraint, each bounded constraint must finish at least once, and every block is free at the end. Then the same through CUDA graphs off (enforce_eager), since the mask is applied outside the graph.
"""
import argparse, json, re, shutil, tempfile, time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from paged_infer.core.sampling_params import SamplingParams
from paged_infer.core.structured_outputs import StructuredOutputsParams
from paged_infer.entrypoints.llm import LLM
from paged_infer.entrypoints.protocol import ChatCompletionRequest
from paged_infer.entrypoints.tools import ToolPlan
from paged_infer.model.default_model import prepare_default_model

SCHEMA = {'type': 'object', 'properties': {'b': {'enum': ['x', 'y']}, 'c': {'type': 'boolean'}}, 'required': ['b', 'c'],
          'additionalProperties': False}
UNBOUNDED = ('json_object',)  # any object: random weights may write keys until max_tokens; finished ones are checked
TOOL = {'type': 'function', 'function': {'name': 'pick', 'parameters': SCHEMA}}


def random_model(assets: Path, out: Path) -> Path:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(assets), dtype=torch.bfloat16)  # written as bf16
    model.save_pretrained(out)
    for f in assets.glob('tokenizer*'):
        shutil.copy(f, out / f.name)
    return out


def cases():
    "(name, structured outputs, n, check of one answer's text)."
    plan = ToolPlan(ChatCompletionRequest.model_validate(
        {'model': 'm', 'messages': [{'role': 'user', 'content': 'x'}], 'tools': [TOOL], 'tool_choice': 'required',
         'parallel_tool_calls': False}))

    def tool_ok(text):
        calls = plan.parse(text, True)[1]
        return len(calls) == 1 and calls[0][0] == 'pick' and set(json.loads(calls[0][1])) == {'b', 'c'}

    return [
        ('choice', StructuredOutputsParams(choice=['yes', 'no', 'maybe']), 2, lambda t: t in ('yes', 'no', 'maybe')),
        ('regex', StructuredOutputsParams(regex=r'[0-9]{3}-[0-9]{4}'), 2, lambda t: re.fullmatch(r'[0-9]{3}-[0-9]{4}', t)),
        ('json_schema', StructuredOutputsParams(json={**SCHEMA, 'x-guidance': {'whitespace_flexible': False}}), 3, lambda t: set(json.loads(t)) == {'b', 'c'}),
        ('json_object', StructuredOutputsParams(json_object=True), 1, lambda t: isinstance(json.loads(t), dict)),
        ('grammar', StructuredOutputsParams(grammar='start: ("ab" | "cd")+ "."'), 1, lambda t: re.fullmatch(r'(ab|cd)+\.', t)),
        ('tool_required', plan.structured, 1, tool_ok),
    ]


def run(folder: Path, eager: bool) -> dict:
    llm = LLM(model=str(folder), dtype='bfloat16' if torch.cuda.is_available() else 'float32', enforce_eager=eager)
    reqs, checks = [], []
    for name, so, n, ok in cases():
        reqs.append((name, SamplingParams(temperature=1.0, seed=len(reqs), n=n, max_tokens=48, structured_outputs=so), ok))
    for i in range(8):  # unconstrained neighbours in the same batch
        reqs.append((f'free{i}', SamplingParams(temperature=1.0, seed=100 + i, max_tokens=48), None))
    prompts = [{'prompt_token_ids': list(range(10 + i, 30 + i))} for i in range(len(reqs))]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, [p for _, p, _ in reqs], use_tqdm=False)
    seconds = time.perf_counter() - t0
    results = {}
    for (name, _, ok), out in zip(reqs, outs):
        for c in out.outputs:
            finished = c.finish_reason == 'stop'
            valid = bool(ok(c.text)) if ok is not None and finished else None
            results.setdefault(name, []).append({'text': c.text, 'finish_reason': c.finish_reason, 'valid': valid})
    free = llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.gpu.num_blocks
    return {'eager': eager, 'seconds': round(seconds, 3), 'all_blocks_free': free, 'results': results}


def main():
    ap = argparse.ArgumentParser(description='Structured outputs on the GPU.')
    ap.add_argument('--assets', default=None)
    ap.add_argument('--out', default='.')
    a = ap.parse_args()
    assets = Path(a.assets or prepare_default_model())
    folder = random_model(assets, Path(tempfile.mkdtemp()) / 'smollm2-random')
    report = {'device': torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', 'torch': torch.__version__, 'runs': [run(folder, e) for e in (False, True)]}
    bad = []
    for r in report['runs']:
        if not r['all_blocks_free']:
            bad.append(f"eager={r['eager']}: blocks leaked")
        for name, answers in r['results'].items():
            bad += [f"eager={r['eager']} {name}: {x['text']!r}" for x in answers if x['valid'] is False]
            if name not in UNBOUNDED and not name.startswith('free') and not any(x['valid'] for x in answers):
                bad.append(f"eager={r['eager']} {name}: no answer finished inside the grammar")
    report['failures'] = bad
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, 'gpu_structured_check.json').write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != 'runs'}, indent=1))
    for r in report['runs']:
        print('eager' if r['eager'] else 'graphs', r['seconds'], 's;', {n: [(x['finish_reason'], x['valid']) for x in v] for n, v in r['results'].items() if not n.startswith('free')})
    raise SystemExit(1 if bad else 0)


if __name__ == '__main__':
    main()
