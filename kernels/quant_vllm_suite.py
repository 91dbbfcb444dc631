"""Inside vLLM's Python: one `vllm.LLM` for several measurements of chapter 17e's peer (its latency and throughput
parts), so that one engine start serves them all. Used by kernels/quant_engine_bench.py.

    python quant_vllm_suite.py SPEC.json RESULT.json   # SPEC: {"llm": {...}, "parts": [latency or throughput specs]}
"""
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

spec_path = Path(__file__).resolve().parents[1] / 'paged_infer' / 'bench' / 'vllm_peer.py'
load = importlib.util.spec_from_file_location('vllm_peer', spec_path)
peer = importlib.util.module_from_spec(load)
load.loader.exec_module(peer)  # standard library only, until vllm


def main(argv):
    spec = json.loads(Path(argv[0]).read_text())
    for k, v in peer._QUIET.items():
        os.environ.setdefault(k, v)
    import torch
    import vllm

    t0 = time.perf_counter()
    llm = vllm.LLM(skip_tokenizer_init=True, **spec['llm'])
    init_s = time.perf_counter() - t0
    quant = str(llm.llm_engine.vllm_config.model_config.quantization)
    parts = []
    for part in spec['parts']:
        run = peer._peer_throughput if part['kind'] == 'throughput' else peer._peer_latency
        r = run(llm, part)
        r.pop('output_token_ids', None)
        parts.append(r)
    Path(argv[1]).write_text(json.dumps(dict(parts=parts, vllm_version=vllm.__version__, init_s=init_s, quant=quant,
                                             gpu=torch.cuda.get_device_name())))


if __name__ == '__main__':
    main(sys.argv[1:])
