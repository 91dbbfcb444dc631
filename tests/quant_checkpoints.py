"""Quantized copies of the default model, written by the libraries that define each format, and their oracles.

Each checkpoint is made from SmolLM2-135M-Instruct (float32) by the format's own code:
- compressed-tensors (llm-compressor's format): `calculate_qparams` and the format's compressor (`compress`);
  llm-compressor itself pins an older transformers, so its minimum/maximum observers are two torch reductions here;
- AWQ: AutoAWQ's `AwqQuantizer.pseudo_quantize_tensor` and `WQLinear_GEMM.from_linear` (its packing);
- GPTQ: gptqmodel's `Quantizer.find_params` per group and `TorchLinear.pack_original`, then its v2 -> v1 converter
  (the `checkpoint_format: gptq` files it writes); round to nearest, not the Hessian search: the format is the point.
The oracle of each is a float folder whose linear weights are the library's own dequantization of the checkpoint
(compressed-tensors' `decompress`, AutoAWQ's `dequantize_gemm`, gptqmodel's `dequantize_weight`).
Folders are cached under the engine's cache root (`PAGED_INFER_CACHE`), as the default model is.
"""

import fcntl
import json
import os
import shutil
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from paged_infer.model.default_model import cache_root, prepare_default_model

os.environ.setdefault('GPTQMODEL_CPU_WORKERS', '2')
CALIBRATION = 'The quick brown fox jumps over the lazy dog. Paged attention keeps the KV cache in blocks of 16 tokens.'


def _linears(sd: dict) -> list:
    "Names of the decoder layers' linear layers (lm_head and embeddings stay float, as the libraries leave them)."
    return sorted(k[: -len('.weight')] for k in sd if k.startswith('model.layers.') and k.endswith('_proj.weight'))


def _write(src: Path, out: Path, tensors: dict, quantization_config: dict | None, **config_changes):
    tmp = out.with_name(out.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != '.safetensors' and f.name not in ('.complete', 'config.json'):
            shutil.copy(f, tmp / f.name)
    config = json.loads((src / 'config.json').read_text())
    if quantization_config is not None:
        config['quantization_config'] = quantization_config
    config.update(config_changes)
    (tmp / 'config.json').write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp / 'model.safetensors', metadata={'format': 'pt'})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _activation_max(src: Path) -> dict:
    "Largest |input| of each linear layer over the calibration text (static fp8 activation scales)."
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(src)(CALIBRATION, return_tensors='pt').input_ids
    amax, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name.startswith('model.layers.'):
            hooks.append(m.register_forward_hook(lambda m, i, o, n=name: amax.__setitem__(n, i[0].abs().max())))
    with torch.no_grad():
        model(ids)
    return amax


def make_compressed(src: Path, out: Path, oracle: Path, scheme_name: str):
    "compressed-tensors checkpoint: 'w4a16' (group 32), 'w4a16-asym', 'w8a16', 'fp8-dynamic', 'fp8-static'."
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    if scheme_name.startswith('fp8'):
        weights = QuantizationArgs(num_bits=8, type='float', strategy='channel', symmetric=True)
        dynamic = scheme_name == 'fp8-dynamic'
        acts = QuantizationArgs(num_bits=8, type='float', strategy='token' if dynamic else 'tensor', dynamic=dynamic,
                                symmetric=True)
        fmt = 'float-quantized'
    else:
        bits, sym = (8, True) if scheme_name == 'w8a16' else (4, scheme_name != 'w4a16-asym')
        weights = QuantizationArgs(num_bits=bits, type='int', strategy='group', group_size=32, symmetric=sym)
        acts, fmt = None, 'pack-quantized'
    scheme = QuantizationScheme(targets=['Linear'], weights=weights, input_activations=acts, format=fmt)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    sd = load_file(src / 'model.safetensors')
    amax = _activation_max(src) if acts is not None and not acts.dynamic else {}
    qsd, fsd = dict(sd), dict(sd)
    for name in _linears(sd):
        w = qsd.pop(f'{name}.weight')
        if weights.strategy == 'group':
            g = w.view(w.shape[0], -1, weights.group_size)
            lo, hi = g.amin(-1), g.amax(-1)  # (N, G)
        else:
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)  # (N, 1)
        scale, zero = calculate_qparams(lo, hi, weights)
        local = {'weight': w, 'weight_scale': scale, 'weight_zero_point': zero}
        if name in amax:
            local['input_scale'], _ = calculate_qparams(-amax[name].view(1), amax[name].view(1), acts)
        packed = compressor.compress(local, scheme)
        qsd.update({f'{name}.{k}': v for k, v in packed.items()})
        fsd[f'{name}.weight'] = compressor.decompress(dict(packed), scheme)['weight'].float()
    config = QuantizationConfig(config_groups={'group_0': scheme}, format=fmt, ignore=['lm_head'],
                                quantization_status='compressed').model_dump(mode='json')
    config['quant_method'] = 'compressed-tensors'
    _write(src, out, qsd, config)
    _write(src, oracle, fsd, None)


def make_awq(src: Path, out: Path, oracle: Path, group_size: int = 128):
    "AutoAWQ GEMM checkpoint (4-bit, zero points): AutoAWQ's round-to-nearest and its packing."
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.quantize.quantizer import AwqQuantizer
    from awq.utils.packing_utils import dequantize_gemm

    q = types.SimpleNamespace(w_bit=4, group_size=group_size, zero_point=True)
    sd = load_file(src / 'model.safetensors')
    qsd, fsd = dict(sd), dict(sd)
    for name in _linears(sd):
        w = qsd.pop(f'{name}.weight').half()
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False).half()
        lin.weight.data, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(q, w.clone())
        ql = WQLinear_GEMM.from_linear(lin, 4, group_size, init_only=False, scales=scales.t().contiguous(),
                                       zeros=zeros.t().contiguous())
        for k in ('qweight', 'qzeros', 'scales'):
            qsd[f'{name}.{k}'] = getattr(ql, k)
        fsd[f'{name}.weight'] = dequantize_gemm(ql.qweight, ql.qzeros, ql.scales, 4, group_size).t().float()
    config = {'quant_method': 'awq', 'bits': 4, 'group_size': group_size, 'zero_point': True, 'version': 'gemm',
              'modules_to_not_convert': None}
    _write(src, out, qsd, config)
    _write(src, oracle, fsd, None)


def make_gptq(src: Path, out: Path, oracle: Path, bits: int = 4, group_size: int = 128, desc_act: bool = False,
              sym: bool = True, lm_head: bool = False):
    """GPTQ checkpoint as gptqmodel writes it (checkpoint_format 'gptq'); `desc_act`: groups in a shuffled order;
    `lm_head`: the output layer quantized too (gptqmodel's `lm_head=True`), as its own layer, no longer tied to the
    embedding (which stays float)."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization.config import QuantizeConfig
    from gptqmodel.quantization.quantizer import Quantizer
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module, convert_gptq_v2_to_v1_format_module

    qcfg = QuantizeConfig(bits=bits, group_size=group_size, desc_act=desc_act, sym=sym)
    sd = load_file(src / 'model.safetensors')
    qsd, fsd = dict(sd), dict(sd)
    gen = torch.Generator().manual_seed(0)
    if lm_head:  # SmolLM2 ties its output layer to the embedding: the quantized copy is the output layer's own
        qsd['lm_head.weight'] = fsd['lm_head.weight'] = sd['model.embed_tokens.weight']
    for name in _linears(sd) + (['lm_head'] if lm_head else []):
        w = qsd.pop(f'{name}.weight').float()
        N, K = w.shape
        order = torch.randperm(K, generator=gen) if desc_act else torch.arange(K)  # the order GPTQ visits inputs
        g_idx = torch.empty(K, dtype=torch.int32)
        g_idx[order] = (torch.arange(K) // group_size).to(torch.int32)
        scales, zeros = [], []
        for g in range(K // group_size):
            quantizer = Quantizer(qcfg)
            quantizer.configure(perchannel=True)
            quantizer.find_params(w[:, order[g * group_size:(g + 1) * group_size]], weight=True)
            scales.append(quantizer.scale.reshape(N, 1))
            zeros.append(quantizer.zero.reshape(N, 1))
        lin = nn.Linear(K, N, bias=False)
        lin.weight.data = w
        ql = TorchLinear(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, in_features=K, out_features=N,
                         bias=False)
        ql.pack_original(lin, torch.cat(scales, 1), torch.cat(zeros, 1), g_idx)
        convert_gptq_v2_to_v1_format_module(ql, types.SimpleNamespace(bits=bits, pack_dtype=torch.int32))
        for k in ('qweight', 'qzeros', 'scales', 'g_idx'):
            qsd[f'{name}.{k}'] = getattr(ql, k).clone()
        convert_gptq_v1_to_v2_format_module(ql, bits=bits, pack_dtype=torch.int32)  # back, as a reader does
        fsd[f'{name}.weight'] = ql.eval().dequantize_weight().T.float()
    config = {'quant_method': 'gptq', 'bits': bits, 'group_size': group_size, 'desc_act': desc_act, 'sym': sym,
              'lm_head': lm_head, 'checkpoint_format': 'gptq'}
    untied = {'tie_word_embeddings': False} if lm_head else {}
    _write(src, out, qsd, config, **untied)
    _write(src, oracle, fsd, None, **untied)


MAKERS = {
    'ct-w4a16': lambda s, o, f: make_compressed(s, o, f, 'w4a16'),
    'ct-w4a16-asym': lambda s, o, f: make_compressed(s, o, f, 'w4a16-asym'),
    'ct-w8a16': lambda s, o, f: make_compressed(s, o, f, 'w8a16'),
    'ct-fp8-dynamic': lambda s, o, f: make_compressed(s, o, f, 'fp8-dynamic'),
    'ct-fp8-static': lambda s, o, f: make_compressed(s, o, f, 'fp8-static'),
    'awq': lambda s, o, f: make_awq(s, o, f, 64),  # SmolLM2's 576 features hold no group of 128
    'awq-g32': lambda s, o, f: make_awq(s, o, f, 32),
    'gptq': lambda s, o, f: make_gptq(s, o, f, 4, 64),
    'gptq-act-asym': lambda s, o, f: make_gptq(s, o, f, 4, 64, desc_act=True, sym=False),
    'gptq-8bit-act': lambda s, o, f: make_gptq(s, o, f, 8, 64, desc_act=True),
    'gptq-lm-head': lambda s, o, f: make_gptq(s, o, f, 4, 64, lm_head=True),
}


def checkpoint(name: str) -> tuple:
    "(quantized folder, oracle float folder) of one format, made once and cached."
    root = cache_root() / 'quant-tests'
    out, oracle = root / name, root / f'{name}.oracle'
    done = root / f'{name}.complete'
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f'{name}.lock', 'w') as lock:  # test processes in parallel: one makes it, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            MAKERS[name](prepare_default_model(), out, oracle)
            done.touch()
    return out, oracle
