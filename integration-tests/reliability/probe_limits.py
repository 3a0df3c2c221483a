"""Probes of the known limits in docs/RELIABILITY.md (not a test: it reports what happens,
it does not judge). Run from the repository root:

    SONDE_BIN_DIR=target/release .venv-e2e/bin/python integration-tests/reliability/probe_limits.py

1. Stalled connections (half-sent headers, a body stopped short, an idle keep-alive): how
   long the router keeps them, and whether stalled bodies hold request slots.
2. Clients that never read a stream larger than the socket buffers and never close: whether
   their slots stay taken after the generation ends.
"""

import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

WATCH_S = 80


def _connect(lz, rcvbuf=None):
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(WATCH_S + 5)
    s.connect(("127.0.0.1", lz.port))
    return s


def _watch(name, s, out):
    started = time.monotonic()
    try:
        data = s.recv(4096)
        out[name] = f"answered or closed after {time.monotonic() - started:.1f} s: {data[:60]!r}"
    except socket.timeout:
        out[name] = f"still open after {time.monotonic() - started:.1f} s"


def stalled_connections():
    lz = harness.start("--max-concurrent-requests", 4, name="probe-stalled")
    out, socks = {}, {}
    try:
        socks["half_headers"] = _connect(lz)
        socks["half_headers"].sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        for i in range(8):
            s = socks[f"body_10_of_100_bytes_{i}"] = _connect(lz)
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"inputs\":")
        idle = socks["idle_keep_alive"] = _connect(lz)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)
        idle.recv(4096)
        r = harness.post(lz, "/generate", harness.gen_body("Hello", 3))
        out["new_request_with_8_stalled_bodies_and_4_slots"] = r.status_code
        threads = [threading.Thread(target=_watch, args=(n, s, out)) for n, s in socks.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for s in socks.values():
            s.close()
        lz.stop()
    return out


def never_read_never_close():
    lz = harness.start("--max-concurrent-requests", 2, name="probe-never-read")
    out, socks = {}, []
    try:
        # ~6 KB of events per token: 1,500 tokens are far more than the socket buffers hold.
        params = {"max_new_tokens": 1500, "details": True, "top_n_tokens": 5,
                  "logprob_token_ids": list(range(128))}
        for i in range(2):
            body = json.dumps({"inputs": f"Chapter {i}. Once upon a time", "parameters": params}).encode()
            s = _connect(lz, rcvbuf=1024)
            s.sendall(b"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            socks.append(s)
        started = time.monotonic()
        harness.wait_gauge(lz, "sonde_batch_current_size", 2)
        while harness.gauge(lz, "sonde_batch_current_size") > 0 and time.monotonic() - started < 300:
            time.sleep(0.5)
        out["generation_ended_after_s"] = round(time.monotonic() - started, 1)
        time.sleep(2)
        r = harness.post(lz, "/generate", harness.gen_body("Hello", 3))
        out["new_request_while_unread"] = f"{r.status_code} {r.text[:100]}"
        for s in socks:
            s.close()
        time.sleep(2)
        out["new_request_after_they_close"] = harness.post(
            lz, "/generate", harness.gen_body("Hello", 3)).status_code
    finally:
        for s in socks:
            s.close()
        lz.stop()
    return out


if __name__ == "__main__":
    print(json.dumps({"stalled_connections": stalled_connections(),
                      "never_read_never_close": never_read_never_close()}, indent=1))
