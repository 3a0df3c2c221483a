"""A client that goes away frees its slot: the batch must not keep generating for nobody.

Raw sockets, so "going away" is exactly a TCP close mid-stream, with no client library
draining the body or keeping the connection alive behind our back.
"""

import json
import socket
import time

from sonde_http import generate, post

STREAMS = 20
EVENTS_BEFORE_CLOSE = 2
FREED_WITHIN_S = 10


def gauge(metrics, name):
    vals = [v for k, v in metrics.items() if k == name or k.startswith(name + "{")]
    assert vals, f"metric {name} missing; have {sorted(metrics)[:50]}"
    return sum(vals)


def _open_stream(server, prompt):
    body = json.dumps({"inputs": prompt, "parameters": {"max_new_tokens": 200}}).encode()
    head = (f"POST /generate_stream HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    s.sendall(head + body)
    return s


def _read_events(sock, n):
    buf = b""
    while buf.count(b"data:") < n:
        chunk = sock.recv(65536)
        assert chunk, f"server closed the stream early: {buf[-2000:]!r}"
        buf += chunk
    assert buf.startswith(b"HTTP/1.1 200"), buf[:500]
    return buf


def test_closed_streams_free_their_slots(server):
    socks = [_open_stream(server, f"Chapter {i}. Once upon a time") for i in range(STREAMS)]
    try:
        for s in socks:
            _read_events(s, EVENTS_BEFORE_CLOSE)
        m = server.metrics()
        # The gauges must be live, or "0 after closing" would prove nothing.
        busy = gauge(m, "sonde_queue_size") + gauge(m, "sonde_batch_current_size")
        assert busy >= 1, f"20 streams are open but the gauges say {busy}"
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + FREED_WITHIN_S
    while True:
        m = server.metrics()
        q, b = gauge(m, "sonde_queue_size"), gauge(m, "sonde_batch_current_size")
        if q == 0 and b == 0:
            break
        assert time.monotonic() < deadline, (
            f"{FREED_WITHIN_S} s after closing, queue={q} batch={b}: cancelled streams still run")
        time.sleep(0.2)
    r = generate(server, "Once upon a time", max_new_tokens=2, details=True)
    assert r["details"]["generated_tokens"] == 2


def test_request_count_by_status(server):
    def count(status):
        return sum(v for k, v in server.metrics().items()
                   if k.startswith("sonde_request_count{") and f'status="{status}"' in k
                   and "generate" in k)  # /metrics polls must not count here

    ok0, bad0 = count(200), count(422)
    generate(server, "Hello", max_new_tokens=1)
    r = post(server, "/generate", {"inputs": "Hello", "parameters": {"top_n_tokens": 99}})
    assert r.status_code == 422
    assert count(200) >= ok0 + 1
    assert count(422) >= bad0 + 1
