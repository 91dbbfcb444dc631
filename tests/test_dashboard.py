"""The dashboard (chapter 16h) against a real uvicorn server on the default model, its page in a real headless Chromium.

`/dashboard/state` read with httpx while requests stream through the official `openai` client: the pool adds up,
the running sequences' blocks are used, the rates rise, and all is free again afterwards. The page, driven by
Playwright (Debian's /usr/bin/chromium; no browser is ever downloaded): it loads without a console error or a page
error, its running count and used-block count follow the engine while requests stream, the block under the pointer
names its request and is drawn in a request's colour, and the page comes back to no running request and no used
block; a read that fails (an error status, a dropped connection) shows in the status line, and the page recovers.
"""
import re
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from helpers import ServerThread
from paged_infer.core.config import EngineConfig
from paged_infer.entrypoints.async_engine import AsyncLLMEngine
from paged_infer.entrypoints.server import build_app

NAME = 'SmolLM2-135M-Instruct'
BLOCKS = 96
CHROMIUM = Path('/usr/bin/chromium')
QUESTIONS = ('Name a river.', 'Name a bird.', 'Tell me a joke.')
CACHED_RGB = [143, 211, 182]  # the page's colour of a cached block (free and used ones are greys)


@pytest.fixture(scope='module')
def server():
    engine = AsyncLLMEngine.from_config(EngineConfig(num_gpu_blocks=BLOCKS, max_model_len=1024, max_num_seqs=8),
                                        max_wait_ms=5)
    app = build_app(engine, NAME)  # with the dashboard's routes (chapter 16h)
    with ServerThread(app) as url:
        yield url, engine
    engine.shutdown()


@pytest.fixture(scope='module')
def browser():
    if not CHROMIUM.exists():
        pytest.skip('needs Chromium at /usr/bin/chromium (Debian package `chromium`; `make install` installs it)')
    sync_api = pytest.importorskip('playwright.sync_api')
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=['--no-sandbox'])
        yield b
        b.close()


def stream(url: str, max_tokens: int = 48):
    "Start one streaming chat request per question, each in a thread; (threads, errors they raised)."
    client = openai.OpenAI(base_url=url + '/v1', api_key='unused', max_retries=0, timeout=120)
    errors = []

    def ask(q):
        try:
            for _ in client.chat.completions.create(model=NAME, messages=[{'role': 'user', 'content': q}],
                                                    max_tokens=max_tokens, temperature=0, stream=True,
                                                    extra_body={'ignore_eos': True}):
                pass
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(q,), daemon=True) for q in QUESTIONS]
    for t in threads:
        t.start()
    return threads, errors


def state(url: str) -> dict:
    r = httpx.get(url + '/dashboard/state', timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_idle(url: str, timeout: float = 20.0) -> dict:
    "The state once no request runs and no block is used (the last outputs reach clients a step before that)."
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        s = state(url)
        if not any(s['queues'].values()) and s['pool']['num_used'] == 0:
            return s
        time.sleep(0.05)
    raise AssertionError(f'still busy: {s["queues"]}, {s["pool"]["num_used"]} blocks used')


def test_state_json(server):
    url, engine = server
    page = httpx.get(url + '/dashboard')
    assert page.status_code == 200 and page.headers['content-type'].startswith('text/html')
    assert '<canvas id="pool"' in page.text
    assert re.findall(r'(?:src|href)="([^"]*)"', page.text) == ['data:,']  # nothing loaded from elsewhere
    s = wait_idle(url)
    p = s['pool']
    assert (p['num_blocks'], p['num_free'], p['num_used'], len(p['states'])) == (BLOCKS, BLOCKS, 0, BLOCKS)
    assert set(p['states']) <= {'f', 'c'} and p['num_cached'] == p['states'].count('c')
    assert s['engine_running'] and s['error'] is None and s['block_size'] == 16 and s['sequences'] == []
    steps0 = s['num_steps']
    threads, errors = stream(url)
    seen = []
    while any(t.is_alive() for t in threads):
        seen.append(state(url))
        time.sleep(0.1)
    assert not errors, errors
    busy = [s for s in seen if s['queues']['running']]
    assert busy, 'no snapshot saw a running request'
    for s in busy:
        p = s['pool']
        assert p['num_free'] + p['num_used'] == BLOCKS and len(p['states']) == BLOCKS
        assert {q['request_id'] for q in s['sequences']} <= set(s['queues']['running'])
        assert all(len(q['blocks']) == -(-q['num_tokens'] // 16) for q in s['sequences'])
    # each running block reads as used, but for the snapshots a step stale (a request ending while it was taken)
    held = [all(s['pool']['states'][b] == 'u' for q in s['sequences'] for b in q['blocks']) for s in busy]
    assert sum(held) >= 0.8 * len(held), held
    assert len({s['pool']['num_used'] for s in busy}) > 1  # the pool grows as the answers do
    assert max(s['rates']['steps_per_s'] for s in seen) > 0
    assert max(s['rates']['generation_tokens_per_s'] for s in seen) > 0
    end = wait_idle(url)
    assert end['num_steps'] - steps0 >= 48 and end['pool']['num_free'] == BLOCKS
    engine.engine.block_manager.check_invariants()


def open_page(browser, url: str):
    "The dashboard in a new page; (page, the console errors and page errors it reports)."
    page = browser.new_page(viewport={'width': 1200, 'height': 900})
    problems = []
    page.on('console', lambda m: problems.append(f'console {m.type}: {m.text}') if m.type == 'error' else None)
    page.on('pageerror', lambda e: problems.append(f'page error: {e}'))
    page.goto(url + '/dashboard')
    return page, problems


def live(page, timeout: float = 10_000):
    page.wait_for_function("document.getElementById('status').className === 'ok'", timeout=timeout)


def number(page, id: str) -> float:
    return float(page.inner_text(f'#{id}').split()[0])


def hover_a_running_block(page):
    "Point at the first block of the first running sequence in the page's table: (block, request id, the page's words)."
    cells = page.locator('#tables tr').first.locator('td').all_inner_texts()
    rid, block = cells[0], int(cells[3].split()[0])
    cell, cols = page.eval_on_selector('#pool', 'c => [+c.dataset.cell, +c.dataset.cols]')
    x, y = (block % cols) * cell + cell // 2, (block // cols) * cell + cell // 2
    rgb = page.eval_on_selector('#pool', f'c => Array.from(c.getContext("2d").getImageData({x}, {y}, 1, 1).data)')
    page.hover('#pool', position={'x': x, 'y': y})
    return block, rid, page.inner_text('#hover'), rgb[:3]


def test_the_page_follows_the_engine(server, browser):
    url, _ = server
    wait_idle(url)
    page, problems = open_page(browser, url)
    live(page)
    assert number(page, 'num-blocks') == BLOCKS and number(page, 'used-count') == 0
    assert number(page, 'running-count') == 0 and page.locator('#tables tr').count() == 0
    threads, errors = stream(url)
    page.wait_for_function("+document.getElementById('running-count').textContent > 0", timeout=30_000)
    used, steps, hovers = set(), [], []
    while any(t.is_alive() for t in threads):
        used.add(number(page, 'used-count'))
        steps.append(number(page, 'steps-per-s'))
        if number(page, 'running-count') > 0 and page.locator('#tables tr').count() > 0:
            try:
                hovers.append(hover_a_running_block(page))
            except (IndexError, ValueError):
                pass  # the table changed under the test's reading: the next round reads it again
        time.sleep(0.2)
    assert not errors, errors
    assert len(used) > 1 and max(used) > 0, used
    assert max(steps) > 0
    assert hovers and all(text.startswith(f'block {b}: ') for b, _, text, _ in hovers), hovers  # the one pointed at
    named = [(rid, text, rgb) for _, rid, text, rgb in hovers if rid in text]
    assert named, hovers  # it names the request whose table holds it
    colours = [rgb for *_, rgb in named if len(set(rgb)) > 1 and rgb != CACHED_RGB]  # not grey, not cached
    assert colours, named  # drawn in a request's colour
    page.wait_for_function("+document.getElementById('running-count').textContent === 0"
                           " && +document.getElementById('used-count').textContent === 0", timeout=15_000)
    live(page)
    assert number(page, 'free-count') == BLOCKS and number(page, 'cached-count') >= 0
    assert page.locator('#running-ids li').count() == 0 and page.locator('#tables tr').count() == 0
    assert problems == []
    page.close()


def test_a_failed_read_shows_in_the_status_line(server, browser):
    url, _ = server
    page, problems = open_page(browser, url)
    live(page)
    page.route('**/dashboard/state', lambda route: route.fulfill(status=503, body='unavailable'))
    page.wait_for_function("document.getElementById('status').className === 'err'", timeout=5_000)
    assert 'HTTP 503' in page.inner_text('#status')
    page.unroute('**/dashboard/state')
    live(page)
    page.route('**/dashboard/state', lambda route: route.abort())  # the connection fails: fetch rejects
    page.wait_for_function("document.getElementById('status').className === 'err'", timeout=5_000)
    assert 'cannot read' in page.inner_text('#status')
    page.unroute('**/dashboard/state')
    live(page)
    # the browser itself logs each failed load as a console error; the page adds none and throws none
    assert [p for p in problems if 'Failed to load resource' not in p] == []
    page.close()
