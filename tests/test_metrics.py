"""Prometheus metrics end to end: a real engine behind real uvicorn, requests through the official `openai` client,
/metrics parsed with prometheus_client's parser. Every family has vLLM's name and type; the request histograms
agree with the usage the client was told (prompt and completion tokens), the finish reasons, the parameters sent;
a request's intervals add up (queue + inference = end to end); tokens per step add up to the token counters. The
Grafana dashboard names only metrics the server exports, and the Prometheus configuration scrapes two replicas.
"""
import json
import re
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from helpers import ServerThread, scrape, value
from paged_infer.core.config import EngineConfig
from paged_infer.entrypoints.async_engine import AsyncLLMEngine
from paged_infer.entrypoints.server import build_app

NAME = 'SmolLM2-135M-Instruct'
DEPLOY = Path(__file__).parent.parent / 'deploy'
FAMILIES = {  # vLLM's names (prefix paged_infer:) and types; counters as the parser names them (no _total)
    'num_requests_running': 'gauge', 'num_requests_waiting': 'gauge', 'num_requests_swapped': 'gauge',
    'kv_cache_usage_perc': 'gauge', 'gpu_cache_usage_perc': 'gauge', 'cache_config_info': 'gauge',
    'num_preemptions': 'counter', 'prefix_cache_queries': 'counter', 'prefix_cache_hits': 'counter',
    'prompt_tokens': 'counter', 'generation_tokens': 'counter', 'request_success': 'counter',
    'request_rejected': 'counter', 'iteration_tokens_total': 'histogram',
    'time_to_first_token_seconds': 'histogram', 'inter_token_latency_seconds': 'histogram',
    'time_per_output_token_seconds': 'histogram', 'request_time_per_output_token_seconds': 'histogram',
    'e2e_request_latency_seconds': 'histogram', 'request_queue_time_seconds': 'histogram',
    'request_prefill_time_seconds': 'histogram', 'request_decode_time_seconds': 'histogram',
    'request_inference_time_seconds': 'histogram', 'request_prompt_tokens': 'histogram',
    'request_generation_tokens': 'histogram', 'request_max_num_generation_tokens': 'histogram',
    'request_params_n': 'histogram', 'request_params_max_tokens': 'histogram',
}
INTERVALS = ['time_to_first_token_seconds', 'e2e_request_latency_seconds', 'request_queue_time_seconds',
             'request_prefill_time_seconds', 'request_decode_time_seconds', 'request_inference_time_seconds']


@pytest.fixture(scope='module')
def server():
    engine = AsyncLLMEngine.from_config(EngineConfig(num_gpu_blocks=256, max_model_len=1024, max_num_seqs=16),
                                        max_wait_ms=5)
    with ServerThread(build_app(engine, NAME)) as url:
        yield {'url': url, 'engine': engine}
    engine.shutdown()


@pytest.fixture(scope='module')
def run(server):
    "A few requests (one cut by length, one ended by a stop string, a stream, one of n=2), and /metrics around them."
    client = openai.OpenAI(base_url=server['url'] + '/v1', api_key='unused', max_retries=0, timeout=120)
    before = scrape(server['url'])
    usages, reasons, params = [], [], []
    r = client.completions.create(model=NAME, prompt='Count: one, two,', max_tokens=5, temperature=0,
                                  extra_body={'ignore_eos': True})
    usages.append(r.usage)
    reasons += [c.finish_reason for c in r.choices]
    params.append((1, 5))
    r = client.completions.create(model=NAME, prompt='The capital of France is', max_tokens=24, temperature=0,
                                  stop=['.', ','])
    usages.append(r.usage)
    reasons += [c.finish_reason for c in r.choices]
    params.append((1, 24))
    stream = client.chat.completions.create(model=NAME, messages=[{'role': 'user', 'content': 'Hi'}], max_tokens=4,
                                            temperature=0, stream=True, stream_options={'include_usage': True})
    chunks = list(stream)
    usages.append(next(c.usage for c in chunks if c.usage is not None))
    reasons += [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason is not None]
    params.append((1, 4))
    r = client.completions.create(model=NAME, prompt='Once upon a time', max_tokens=3, n=2, temperature=1, seed=1)
    usages.append(r.usage)
    reasons += [c.finish_reason for c in r.choices]
    params.append((2, 3))
    deadline = time.monotonic() + 10
    while server['engine'].engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    return dict(before=before, after=scrape(server['url']), usages=usages, reasons=reasons, params=params)


def delta(run, family, sample=None, **labels):
    return value(run['after'], family, sample, **labels) - value(run['before'], family, sample, **labels)


def test_every_family_with_its_type(run):
    fams = run['after']
    missing = [n for n in FAMILIES if n not in fams]
    assert not missing, f'families not exported: {missing}'
    wrong = {n: fams[n].type for n, t in FAMILIES.items() if fams[n].type != t}
    assert not wrong, f'families of the wrong type: {wrong}'
    assert all(s.labels.get('model_name') == NAME for n in FAMILIES if n != 'cache_config_info'
               for s in fams[n].samples), 'every series has the model_name label'


def test_request_histograms_agree_with_the_client(run):
    "As vLLM's child requests: each choice is observed once, the parameters and the longest choice once per request."
    assert 'length' in run['reasons'] and 'stop' in run['reasons'], run['reasons']
    requests, choices = len(run['usages']), len(run['reasons'])
    assert choices == requests + 1, 'the n=2 request has two choices'
    for name in INTERVALS + ['request_prompt_tokens', 'request_generation_tokens']:
        assert delta(run, name, name + '_count') == choices, name
    for name in ['request_params_n', 'request_params_max_tokens', 'request_max_num_generation_tokens']:
        assert delta(run, name, name + '_count') == requests, name
    assert delta(run, 'request_prompt_tokens', 'request_prompt_tokens_sum') == sum(
        u.prompt_tokens * n for u, (n, _) in zip(run['usages'], run['params']))
    assert delta(run, 'request_generation_tokens', 'request_generation_tokens_sum') == sum(
        u.completion_tokens for u in run['usages'])
    assert delta(run, 'request_params_n', 'request_params_n_sum') == sum(n for n, _ in run['params'])
    assert delta(run, 'request_params_max_tokens', 'request_params_max_tokens_sum') == sum(m for _, m in run['params'])
    for reason in ('stop', 'length', 'abort'):
        assert delta(run, 'request_success', 'request_success_total', finished_reason=reason) == run['reasons'].count(
            reason), reason
    assert delta(run, 'generation_tokens', 'generation_tokens_total') == sum(u.completion_tokens for u in run['usages'])


def test_intervals_add_up(run):
    s = {name: delta(run, name, name + '_sum') for name in INTERVALS}
    queue, prefill, decode, inference = (s[f'request_{k}_time_seconds'] for k in ('queue', 'prefill', 'decode',
                                                                                      'inference'))
    assert all(v >= 0 for v in s.values()) and s['e2e_request_latency_seconds'] > 0, s
    assert abs(queue + inference - s['e2e_request_latency_seconds']) < 1e-6, s
    assert abs(prefill + decode - inference) < 1e-6, s
    assert abs(queue + prefill - s['time_to_first_token_seconds']) < 1e-6, s
    assert decode > 0 and prefill > 0, 'a model step takes time'


def test_tokens_per_step_add_up_to_the_token_counters(run):
    a = run['after']
    steps = value(a, 'iteration_tokens_total', 'iteration_tokens_total_count')
    total = value(a, 'iteration_tokens_total', 'iteration_tokens_total_sum')
    tokens = value(a, 'prompt_tokens', 'prompt_tokens_total') + value(a, 'generation_tokens', 'generation_tokens_total')
    assert steps >= max(u.completion_tokens for u in run['usages']), 'at least one step per token of a request'
    assert total == tokens, (total, tokens)
    buckets = [s for s in a['iteration_tokens_total'].samples if s.name.endswith('_bucket')]
    assert buckets[-1].labels['le'] == '+Inf' and buckets[-1].value == steps
    assert all(x.value <= y.value for x, y in zip(buckets, buckets[1:])), 'cumulative buckets'


def logged(caplog) -> list:
    "The request log's lines so far, as dicts."
    return [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == 'paged_infer.requests']


def test_a_request_hung_up_on_while_it_waits_is_counted_and_logged_as_aborted(caplog):
    """One sequence runs at a time. A stream runs, a second request waits behind it; its client gives up (a read
    timeout) before it got any output, then the stream's client hangs up too. Both count as `abort` in
    request_success and the end-to-end histogram, the waiting one never in the queue-time histogram (its wait never
    ended), and the request log has a line for each, the waiting one with no output tokens."""
    import logging

    engine = AsyncLLMEngine.from_config(EngineConfig(num_gpu_blocks=64, max_num_seqs=1), max_wait_ms=1)
    body = {'model': NAME, 'prompt': 'Write a long story about a dragon.', 'max_tokens': 800, 'ignore_eos': True}
    try:
        with ServerThread(build_app(engine, NAME, log_requests=True)) as url, caplog.at_level(
                logging.INFO, logger='paged_infer.requests'):
            before = scrape(url)
            with httpx.stream('POST', url + '/v1/completions', json=body | {'stream': True}, timeout=60) as r:
                events = (line for line in r.iter_lines() if line.startswith('data: '))
                next(events)
                next(events)  # the stream runs: the next request waits for its sequence slot
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(url + '/v1/completions', json=body, timeout=httpx.Timeout(60, read=1.0))
                deadline = time.monotonic() + 10
                while not logged(caplog) and time.monotonic() < deadline:  # the server sees the hang-up first:
                    time.sleep(0.05)  # closing the stream before that would free the slot for the waiting one
                assert engine.engine.has_unfinished_requests()
            deadline = time.monotonic() + 10
            while engine.engine.has_unfinished_requests() and time.monotonic() < deadline:
                time.sleep(0.05)
            after = scrape(url)
            lines = logged(caplog)
    finally:
        engine.shutdown()
    d = lambda family, sample=None, **labels: value(after, family, sample, **labels) - value(before, family, sample,
                                                                                                 **labels)
    assert d('request_success', 'request_success_total', finished_reason='abort') == 2
    assert d('e2e_request_latency_seconds', 'e2e_request_latency_seconds_count') == 2
    assert d('request_queue_time_seconds', 'request_queue_time_seconds_count') == 1, 'only the stream was scheduled'
    assert d('request_prompt_tokens', 'request_prompt_tokens_count') == 2
    assert sorted(rec['output_tokens'] for rec in lines)[0] == 0 and len(lines) == 2, lines
    assert all(rec['finish_reasons'] == ['abort'] for rec in lines), lines
    waited = min(lines, key=lambda rec: rec['output_tokens'])
    assert waited['queue_s'] is None and waited['ttft_s'] is None and waited['e2e_s'] >= 0.9, waited


def test_gauges_and_cache_config(run, server):
    a = run['after']
    assert value(a, 'num_requests_running') == 0 and value(a, 'num_requests_waiting') == 0
    assert value(a, 'kv_cache_usage_perc') == 0, 'every block back once the requests finished'
    assert value(a, 'request_rejected', 'request_rejected_total') == 0, 'no queue bound here: nothing refused'
    [info] = a['cache_config_info'].samples
    assert info.value == 1 and info.labels['num_gpu_blocks'] == '256' and info.labels['block_size'] == '16'
    assert info.labels['num_cpu_blocks'] == str(server['engine'].engine.block_manager.cpu.num_blocks)


def dashboard_names(dash: dict) -> set:
    "The metric names the dashboard's PromQL expressions (and variable queries) read."
    exprs = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ('expr', 'query', 'definition') and isinstance(v, str):
                    exprs.append(v)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(dash)
    return {n for e in exprs for n in re.findall(r'paged_infer:([a-z0-9_]+)', e)}


def exported(name: str, fams: dict) -> bool:
    "Whether a series name belongs to an exported family: itself, or a histogram's/counter's suffixed series."
    if name in fams:
        return True
    for suffix, kind in (('_bucket', 'histogram'), ('_sum', 'histogram'), ('_count', 'histogram'),
                         ('_total', 'counter')):
        base = name.removesuffix(suffix)
        if base != name and base in fams and fams[base].type == kind:
            return True
    return False


def test_dashboard_names_only_exported_metrics(run):
    dash = json.loads((DEPLOY / 'grafana' / 'paged-infer.json').read_text())
    assert dash['schemaVersion'] >= 39 and dash['__inputs'][0]['name'] == 'DS_PROMETHEUS'
    assert all(p['datasource']['uid'] == '${DS_PROMETHEUS}' for p in dash['panels'])
    names = dashboard_names(dash)
    assert len(names) >= 20, names
    unknown = sorted(n for n in names if not exported(n, run['after']))
    assert not unknown, f'the dashboard reads metrics the server does not export: {unknown}'
    titles = {p['title'] for p in dash['panels']}
    for t in ('E2E request latency', 'Time to first token', 'Inter-token latency', 'Token throughput',
              'Scheduler state', 'KV cache usage', 'Prefix cache hit rate', 'Preemptions', 'Finish reason',
              'Queue time', 'Requests per second', 'Request prompt length', 'Request generation length'):
        assert t in titles, t
    assert not exported('e2e_request_latency_seconds_bucketz', run['after']), 'the check itself can say no'


def test_prometheus_config_scrapes_two_replicas():
    cfg = yaml.safe_load((DEPLOY / 'prometheus' / 'prometheus.yml').read_text())
    [job] = [j for j in cfg['scrape_configs'] if j['job_name'] == 'paged-infer']
    assert job.get('metrics_path', '/metrics') == '/metrics'
    targets = [t for sc in job['static_configs'] for t in sc['targets']]
    assert targets == ['localhost:8001', 'localhost:8002'], targets
    assert cfg['global']['scrape_interval'].endswith('s')
