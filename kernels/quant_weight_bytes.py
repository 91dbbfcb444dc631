"""Weight memory of a shape in each quantized layout, counted from the tensors a loaded model holds (random weights,
`load_format='dummy'`): bytes are the same on any device, so this runs on a CPU with enough memory (about 17 GB for
the bf16 Llama-3.1-8B).

    python kernels/quant_weight_bytes.py --tokenizer DIR [--shape llama-3.1-8b]
        [--methods bf16,awq,gptq,gptq-lm-head,fp8]

`gptq-lm-head` is GPTQ with its output layer quantized too (gptqmodel's `lm_head=True`; vLLM reads the same key):
the model folder's config.json carries that `quantization_config`. Prints GB and the share of bf16's bytes.
"""
import argparse
import gc
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from paged_infer.bench.vllm_peer import PEER_QUANT_CONFIGS  # noqa: E402
from paged_infer.bench.workloads import make_random_model  # noqa: E402
from paged_infer.worker.model_runner import load_model  # noqa: E402


def weight_bytes(model) -> int:
    "Bytes of every distinct parameter and buffer (tied weights once)."
    seen, n = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            n += t.numel() * t.element_size()
    return n


def with_lm_head_quantized(folder: Path) -> Path:
    "A sibling folder whose config.json says GPTQ with a quantized output layer."
    dst = folder.with_name(folder.name + '-gptq-lm-head')
    dst.mkdir(exist_ok=True)
    for f in folder.iterdir():
        if f.is_file() and f.name != 'config.json':
            shutil.copy(f, dst / f.name)
    hf = json.loads((folder / 'config.json').read_text())
    gptq = PEER_QUANT_CONFIGS['gptq']
    layers = gptq['modules_in_block_to_quantize'] + [['lm_head']]  # (vLLM checks the output layer against it too)
    hf['quantization_config'] = dict(gptq, lm_head=True, modules_in_block_to_quantize=layers)
    (dst / 'config.json').write_text(json.dumps(hf, indent=1))
    return dst


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--tokenizer', required=True)
    p.add_argument('--shape', default='llama-3.1-8b')
    p.add_argument('--methods', default='bf16,awq,gptq,gptq-lm-head,fp8')
    a = p.parse_args()
    folder = make_random_model(a.shape, tokenizer_folder=a.tokenizer, weights=False)
    sizes = {}
    for method in a.methods.split(','):
        path, q = folder, None if method == 'bf16' else method
        if method == 'gptq-lm-head':
            path, q = with_lm_head_quantized(folder), None  # the scheme comes from its config.json
        model, _ = load_model(path, dtype='bfloat16', device='cpu', load_format='dummy', quantization=q)
        sizes[method] = weight_bytes(model)
        head = type(model.lm_head).__name__
        del model
        gc.collect()
        base = sizes.get('bf16')
        share = f', {sizes[method] / base:.3f} of bf16' if base else ''
        print(f'{a.shape} {method:13s} {sizes[method] / 1e9:6.2f} GB{share} (lm_head: {head})', flush=True)


if __name__ == '__main__':
    main()
