"""What the tests share: uvicorn serving an app in a background thread, on a loopback port; a sample of /metrics."""
import socket
import threading
import time


class ServerThread:
    "uvicorn on 127.0.0.1 in a background thread: `with ServerThread(app) as url: ...`."

    def __init__(self, app, host: str = '127.0.0.1', port: int = 0, log_level: str = 'warning'):
        import uvicorn
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.url = f'http://{host}:{self.sock.getsockname()[1]}'
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={'sockets': [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self.url
            time.sleep(0.01)
        raise RuntimeError('uvicorn did not start')

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def scrape(url: str) -> dict:
    "A server's /metrics, read with prometheus_client's parser, as {family name without the prefix: family}."
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(url + '/metrics', timeout=10).text
    return {f.name.removeprefix('paged_infer:'): f for f in text_string_to_metric_families(text)}


def value(fams: dict, family: str, sample: str | None = None, **labels) -> float:
    "The sum of a family's samples named `sample` (default: the family's own) whose labels include `labels`."
    name = 'paged_infer:' + (sample or family)
    return sum(s.value for s in fams[family].samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def metric(url: str, name: str, **labels) -> float:
    "The value of sample `name` (with these label values) in a server's /metrics."
    for fam in scrape(url).values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f'no {name} {labels} in {url}/metrics')
