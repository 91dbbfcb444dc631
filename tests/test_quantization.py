"""Quantized checkpoints written by the libraries that define the formats (quant_checkpoints.py), read by the engine.

The oracle of each is the library's own dequantization: a float copy of the model whose linear weights the library
computed from the checkpoint. The engine's quantized layers must stand for the same weights, and generate the same
greedy tokens.
"""
import json

import pytest
import torch
from safetensors.torch import load_file

import quant_checkpoints
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.entrypoints.llm import LLM
from paged_infer.core.config import EngineConfigError
from paged_infer.model.quantization import QuantLinear, UnsupportedQuantizationError, fp8_activations, quant_scheme
from paged_infer.worker.model_runner import load_model

PROMPTS = ['The capital of France is', 'def fibonacci(n):', 'Write three colours:']
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0)


def _layers(model) -> dict:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize('name', sorted(quant_checkpoints.MAKERS))
def test_the_weights_are_the_library_dequantization(name):
    "Every quantized layer stands for the weight the library itself dequantizes (fp16 rounding aside for AWQ/GPTQ)."
    qdir, oracle = quant_checkpoints.checkpoint(name)
    model, _ = load_model(qdir)
    layers = _layers(model)
    assert len(layers) == 30 * 7 + (name == 'gptq-lm-head')  # (that one's output layer too)
    ref = load_file(oracle / 'model.safetensors')
    for n, layer in layers.items():
        w, r = layer.reference_weight().float(), ref[f'{n}.weight'].float()
        # AutoAWQ and gptqmodel dequantize in float16: (q - z) * s rounded there, here in float32
        tol = 1e-3 if name.startswith(('awq', 'gptq')) else 0.0
        assert (w - r).abs().max() <= tol * r.abs().max(), n


def _generate(folder, **kw) -> list:
    llm = LLM(model=str(folder), num_gpu_blocks=64, **kw)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.engine.block_manager.num_free_blocks == 64  # nothing leaked
    return outs


@pytest.mark.parametrize('name', ['awq', 'gptq-act-asym', 'gptq-lm-head', 'ct-w4a16-asym', 'ct-w8a16'])
def test_greedy_tokens_are_the_oracle_s(name):
    "The engine on the quantized checkpoint generates the tokens it generates on the library's float weights."
    qdir, oracle = quant_checkpoints.checkpoint(name)
    got, want = _generate(qdir), _generate(oracle)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        lp_g = [d[t] for d, t in zip(g.outputs[0].logprobs, g.outputs[0].token_ids)]
        lp_w = [d[t] for d, t in zip(w.outputs[0].logprobs, w.outputs[0].token_ids)]
        assert max(abs(a - b) for a, b in zip(lp_g, lp_w)) < 0.02


@pytest.mark.parametrize('strategy', ['token', 'tensor'])
def test_fp8_activations_are_compressed_tensors_fake_quantization(strategy):
    "The float values an fp8 GEMM sees for its input: per-token dynamic or static per-tensor, as the library computes."
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    torch.manual_seed(0)
    x = torch.randn(7, 64) * torch.linspace(0.01, 30, 64)
    args = QuantizationArgs(num_bits=8, type='float', strategy=strategy, dynamic=strategy == 'token', symmetric=True)
    if strategy == 'token':
        amax = x.abs().amax(1, keepdim=True)
        scale, zero = calculate_qparams(-amax, amax, args)
        ours = fp8_activations(x, 'token', None)
    else:
        amax = x.abs().max().view(1) * 0.5  # a calibration maximum that some values exceed: they clip
        scale, zero = calculate_qparams(-amax, amax, args)
        ours = fp8_activations(x, 'tensor', scale.float().reshape(()))
    theirs = fake_quantize(x, scale, zero, args)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize('name', ['ct-fp8-dynamic', 'ct-fp8-static'])
def test_fp8_checkpoints_stay_close_to_the_float_weights(name):
    "W8A8: the weights are the library's exactly; activations are quantized too, so greedy tokens may part later."
    qdir, oracle = quant_checkpoints.checkpoint(name)
    got, want = _generate(qdir), _generate(oracle)
    agree = [_common_prefix(g.outputs[0].token_ids, w.outputs[0].token_ids) for g, w in zip(got, want)]
    assert min(agree) >= 4, agree


def _common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_fp8_on_the_fly_from_the_float_checkpoint():
    "--quantization fp8 on a float checkpoint: weights in float8 with a scale per output feature, close to the floats."
    model, _ = load_model(quantization='fp8')
    float_model, _ = load_model()
    layers = _layers(model)
    assert len(layers) == 30 * 7 and all(m.weight.dtype == torch.float8_e4m3fn for m in layers.values())
    w = layers['model.layers.3.mlp.down_proj'].reference_weight()
    r = float_model.get_submodule('model.layers.3.mlp.down_proj').weight
    assert ((w - r).norm() / r.norm()) < 0.04  # e4m3 has 3 mantissa bits: about 2-3% relative error
    assert model.lm_head.__class__.__name__ == 'Linear'  # the output layer stays float, as in vLLM


def _config(folder, **q) -> dict:
    return {**json.loads((folder / 'config.json').read_text()), 'quantization_config': q}


@pytest.mark.parametrize('q, says', [
    ({'quant_method': 'awq', 'bits': 4, 'group_size': 128, 'zero_point': True, 'version': 'gemv'}, 'GEMM'),
    ({'quant_method': 'gptq', 'bits': 3, 'group_size': 128, 'sym': True}, '3-bit'),
    ({'quant_method': 'gptq', 'bits': 4, 'group_size': 128, 'checkpoint_format': 'marlin'}, 'marlin'),
    ({'quant_method': 'bitsandbytes', 'load_in_4bit': True}, 'bitsandbytes'),
    ({'quant_method': 'fp8', 'weight_block_size': [128, 128]}, 'block'),
    ({'quant_method': 'compressed-tensors', 'format': 'int-quantized', 'config_groups': {'g': {
        'weights': {'num_bits': 8, 'type': 'int', 'strategy': 'channel', 'symmetric': True},
        'input_activations': {'num_bits': 8, 'type': 'int', 'strategy': 'token', 'dynamic': True}}}}, 'int-quantized'),
])
def test_an_unsupported_format_is_named(q, says):
    with pytest.raises(UnsupportedQuantizationError, match=says):
        quant_scheme({'quantization_config': q})


def test_quantization_that_contradicts_the_checkpoint_is_refused():
    qdir, _ = quant_checkpoints.checkpoint('awq')
    with pytest.raises(UnsupportedQuantizationError, match="'gptq', but the checkpoint is 'awq'"):
        LLM(model=str(qdir), quantization='gptq', num_gpu_blocks=8)
    with pytest.raises(UnsupportedQuantizationError, match='not quantized'):
        LLM(quantization='awq', num_gpu_blocks=8)
    with pytest.raises(EngineConfigError, match='quantization'):
        LLM(quantization='int3', num_gpu_blocks=8)


def test_the_server_serves_a_quantized_checkpoint():
    "uvicorn on loopback and the official client: greedy chat equals the offline LLM's; a bad request is a 400."
    import openai

    from helpers import ServerThread
    from paged_infer.core.config import EngineConfig
    from paged_infer.entrypoints.async_engine import AsyncLLMEngine
    from paged_infer.entrypoints.server import build_app

    qdir, _ = quant_checkpoints.checkpoint('awq')
    engine = AsyncLLMEngine.from_config(EngineConfig(model=str(qdir), num_gpu_blocks=64, max_model_len=512),
                                        max_wait_ms=5)
    msgs = [{'role': 'user', 'content': 'Name a colour.'}]
    try:
        with ServerThread(build_app(engine, 'awq')) as url:
            client = openai.OpenAI(base_url=url + '/v1', api_key='unused', max_retries=0, timeout=120)
            got = client.chat.completions.create(model='awq', messages=msgs, max_tokens=12, temperature=0)
            with pytest.raises(openai.BadRequestError):
                client.chat.completions.create(model='awq', messages=msgs, max_tokens=-1)
            again = client.chat.completions.create(model='awq', messages=msgs, max_tokens=12, temperature=0)
        assert engine.engine.block_manager.num_free_blocks == 64
    finally:
        engine.shutdown()
    offline = LLM(model=str(qdir), num_gpu_blocks=64, max_model_len=512)
    want = offline.chat(msgs, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)[0].outputs[0].text
    assert got.choices[0].message.content == again.choices[0].message.content == want
