"""Prompt logprobs on the GPU: what the engine keeps while it prefills, against a float32 forward of the same model.

    python tests/gpu/gpu_prompt_logprobs_check.py [--assets DIR] [--out DIR]   # writes DIR/gpu_prompt_logprobs_check.json

A random-weight model of the SmolLM2-135M shape, served in bf16 through the Triton kernels (CUDA graphs on, and
eager), whole prompts and chunked ones (a 64-token budget), beside requests without prompt logprobs; the reference is
transformers' log-softmax over one float32 forward of each prompt, and HF's own bf16 forward beside it, as the parity
check of gpu_parity.py measures: ours no worse than HF bf16 means the path adds nothing beyond bf16 rounding.
"""
import argparse, json, shutil, tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from paged_infer.core.sampling_params import SamplingParams
from paged_infer.entrypoints.llm import LLM
from paged_infer.model.default_model import prepare_default_model


def main():
    ap = argparse.ArgumentParser(description='Prompt logprobs on the GPU.')
    ap.add_argument('--assets', default=None)
    ap.add_argument('--out', default='.')
    a = ap.parse_args()
    assets = Path(a.assets or prepare_default_model())
    folder = Path(tempfile.mkdtemp()) / 'smollm2-random'
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(assets), dtype=torch.bfloat16).save_pretrained(folder)
    for f in assets.glob('tokenizer*'):
        shutil.copy(f, folder / f.name)
    fp32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()
    bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 49152, (n,), generator=g).tolist() for n in (5, 40, 130, 300)]
    refs = []
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([p], device='cuda')
            idx = torch.arange(len(p) - 1, device='cuda'), torch.tensor(p[1:], device='cuda')
            refs.append([m(x).logits[0].float().log_softmax(-1)[idx].cpu() for m in (fp32, bf16)])
    runs = []
    for name, kw in [('graphs', {}), ('eager', dict(enforce_eager=True)), ('chunked', dict(max_num_batched_tokens=64))]:
        llm = LLM(model=str(folder), dtype='bfloat16', **kw)
        params = [SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=2 if i % 2 == 0 else None) for i in range(8)]
        outs = llm.generate([{'prompt_token_ids': prompts[i % 4]} for i in range(8)], params, use_tqdm=False)
        errs, hf_errs = [], []
        for i, out in enumerate(outs):
            p = prompts[i % 4]
            if i % 2:
                assert out.prompt_logprobs is None
                continue
            assert len(out.prompt_logprobs) == len(p) and out.prompt_logprobs[0] is None
            ours = torch.tensor([d[t] for d, t in zip(out.prompt_logprobs[1:], p[1:])])
            errs.append((ours - refs[i % 4][0]).abs().max().item())
            hf_errs.append((refs[i % 4][1] - refs[i % 4][0]).abs().max().item())
        free = llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.gpu.num_blocks
        runs.append({'run': name, 'ours_vs_fp32_max_err': max(errs), 'hf_bf16_vs_fp32_max_err': max(hf_errs), 'all_blocks_free': free})
        print(json.dumps(runs[-1]))
        del llm
    report = {'device': torch.cuda.get_device_name(), 'torch': torch.__version__, 'runs': runs}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, 'gpu_prompt_logprobs_check.json').write_text(json.dumps(report, indent=1))
    bad = [r for r in runs if not r['all_blocks_free'] or r['ours_vs_fp32_max_err'] > 2 * r['hf_bf16_vs_fp32_max_err'] + 1e-3]
    raise SystemExit(1 if bad else 0)


if __name__ == '__main__':
    main()
