#!/usr/bin/env python3
"""A local stand-in for Google Cloud Storage, for tests (Python stdlib only).

It serves the files under ROOT/<bucket>/<key> through exactly the calls that the Rust
`object_store` crate's GCS client makes to download a model. That client speaks GCS's
XML API (not the JSON API):

  GET  /<bucket>?list-type=2&prefix=P[&delimiter=/][&continuation-token=T]
       [&start-after=K][&max-keys=N]            -> ListBucketResult XML
  GET  /<bucket>/<percent-encoded key>           -> the object (Range: bytes=a-b honoured,
                                                     206 + Content-Range; object_store
                                                     resumes a broken body with a Range)
  HEAD /<bucket>/<percent-encoded key>           -> headers only

Every object response carries Content-Length, ETag and Last-Modified, which object_store
requires. Missing keys answer 404 NoSuchKey.

object_store is pointed at this server by a service-account JSON file with
`gcs_base_url` and `disable_oauth` (its documented testing hook); `--credentials-out PATH`
writes one.

Failure injection, to test interrupted downloads: `--fail-object KEY --fail-after-bytes N`
(or POST /_control/fail?object=KEY&after=N at run time; POST /_control/fail with no
parameters clears it). While set, every GET of KEY sends the body only up to absolute
offset N of the object and then drops the connection, so retries cannot get past it.
KEY may be `key` or `bucket/key`.

Control endpoints (paths no bucket can have, since bucket names start with [a-z0-9]):
  GET  /_control/stats   -> {"get": {"bucket/key": n}, "head": {...}, "list": {"bucket": n}}
  POST /_control/reset   -> zero the counters
  POST /_control/fail?object=KEY&after=N  |  POST /_control/fail

From a test: `with fake_gcs.serving(tmp_path, model, "bucket/key") as gcs:` starts it in a
process of its own serving one file, and gives its URL, credentials file and controls.

Usage: python3 fake_gcs.py --root DIR [--port 0] [--credentials-out PATH]
       [--fail-object KEY --fail-after-bytes N] [--exit-on-stdin-eof] [--verbose]
The first line on stdout is `fake_gcs listening on http://127.0.0.1:PORT`.
"""

import argparse
import contextlib
import email.utils
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

CHUNK = 64 * 1024


class State:
    """What the handlers share: the root, the failure setting and the counters."""

    def __init__(self, root, fail_object=None, fail_after=None):
        self.root = os.path.abspath(root)
        self.lock = threading.Lock()
        self.fail_object = fail_object
        self.fail_after = fail_after
        self.reset()

    def reset(self):
        with self.lock:
            self.counts = {"get": {}, "head": {}, "list": {}}

    def count(self, kind, name):
        with self.lock:
            table = self.counts[kind]
            table[name] = table.get(name, 0) + 1

    def fail_limit(self, bucket, key):
        """The absolute offset where a GET of this object is cut, or None."""
        with self.lock:
            if self.fail_object in (key, f"{bucket}/{key}"):
                return self.fail_after
        return None


def list_keys(bucket_dir):
    keys = []
    for dirpath, _dirs, files in os.walk(bucket_dir):
        for name in files:
            full = os.path.join(dirpath, name)
            keys.append(os.path.relpath(full, bucket_dir).replace(os.sep, "/"))
    return sorted(keys)


def object_meta(path):
    st = os.stat(path)
    etag = f'"{st.st_mtime_ns:x}-{st.st_size:x}"'
    return st.st_size, etag, st.st_mtime


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real GCS front end would
    state: State = None  # set on the subclass made in main()
    verbose = False

    def log_message(self, fmt, *args):  # noqa: N802 (http.server's name)
        if self.verbose:
            sys.stderr.write("fake_gcs: " + (fmt % args) + "\n")

    # --- plumbing -------------------------------------------------------------------------
    def _send(self, status, body=b"", headers=None, head=False):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status, code, message, head=False):
        body = (
            "<?xml version='1.0' encoding='UTF-8'?>"
            f"<Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
        ).encode()
        self._send(status, body, {"Content-Type": "application/xml"}, head=head)

    def _split(self):
        parts = urlsplit(self.path)
        bucket, _, rest = parts.path.lstrip("/").partition("/")
        return unquote(bucket), unquote(rest), parse_qs(parts.query)

    # --- verbs ----------------------------------------------------------------------------
    def do_GET(self):  # noqa: N802
        if self.path.startswith("/_control/stats"):
            with self.state.lock:
                body = json.dumps(self.state.counts).encode()
            return self._send(200, body, {"Content-Type": "application/json"})
        bucket, key, query = self._split()
        if not key:
            return self._list(bucket, query)
        return self._object(bucket, key, head=False)

    def do_HEAD(self):  # noqa: N802
        bucket, key, _ = self._split()
        return self._object(bucket, key, head=True)

    def do_POST(self):  # noqa: N802
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if parts.path == "/_control/reset":
            self.state.reset()
        elif parts.path == "/_control/fail":
            with self.state.lock:
                self.state.fail_object = query.get("object", [None])[0]
                after = query.get("after", [None])[0]
                self.state.fail_after = int(after) if after is not None else None
        else:
            return self._error(404, "NotFound", "unknown control endpoint")
        return self._send(200, b"ok")

    # --- the XML API ------------------------------------------------------------------------
    def _list(self, bucket, query):
        bucket_dir = os.path.join(self.state.root, bucket)
        if not bucket or not os.path.isdir(bucket_dir):
            return self._error(404, "NoSuchBucket", f"bucket {bucket} does not exist")
        self.state.count("list", bucket)
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [None])[0]
        after = query.get("continuation-token", query.get("start-after", [""]))[0]
        max_keys = int(query.get("max-keys", ["1000"])[0])
        contents, prefixes, token = [], [], None
        for key in list_keys(bucket_dir):
            if not key.startswith(prefix) or key <= after:
                continue
            if delimiter and delimiter in key[len(prefix):]:
                common = key[: key.index(delimiter, len(prefix)) + len(delimiter)]
                if common not in prefixes:
                    prefixes.append(common)
                continue
            if len(contents) == max_keys:
                token = contents[-1][0]  # the last key sent: the next page starts after it
                break
            size, etag, mtime = object_meta(os.path.join(bucket_dir, key))
            contents.append((key, size, etag, mtime))
        xml = ["<?xml version='1.0' encoding='UTF-8'?>",
               '<ListBucketResult xmlns="http://doc.s3.amazonaws.com/2006-03-01">',
               f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
               f"<KeyCount>{len(contents)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
               f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>"]
        for key, size, etag, mtime in contents:
            stamp = datetime.fromtimestamp(mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
            xml.append(f"<Contents><Key>{escape(key)}</Key><LastModified>{stamp}</LastModified>"
                       f"<ETag>{escape(etag)}</ETag><Size>{size}</Size></Contents>")
        for common in prefixes:
            xml.append(f"<CommonPrefixes><Prefix>{escape(common)}</Prefix></CommonPrefixes>")
        if token:
            xml.append(f"<NextContinuationToken>{escape(token)}</NextContinuationToken>")
        xml.append("</ListBucketResult>")
        return self._send(200, "".join(xml).encode(), {"Content-Type": "application/xml"})

    def _object(self, bucket, key, head):
        path = os.path.join(self.state.root, bucket, *key.split("/"))
        if not bucket or not key or ".." in key.split("/") or not os.path.isfile(path):
            return self._error(404, "NoSuchKey", f"no object {key} in {bucket}", head=head)
        self.state.count("head" if head else "get", f"{bucket}/{key}")
        size, etag, mtime = object_meta(path)
        if self.headers.get("If-Match") not in (None, etag, "*"):
            return self._error(412, "PreconditionFailed", "etag differs", head=head)
        start, end = 0, size  # end exclusive
        status = 200
        headers = {"ETag": etag, "Last-Modified": email.utils.formatdate(mtime, usegmt=True),
                   "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                   "x-goog-generation": str(int(mtime * 1e6))}
        wanted = self.headers.get("Range")
        if wanted and not head:
            parsed = parse_range(wanted, size)
            if parsed is None:
                headers["Content-Range"] = f"bytes */{size}"
                return self._send(416, b"", headers)
            start, end = parsed
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if head:
            return None
        cut = self.state.fail_limit(bucket, key)
        with open(path, "rb") as f:
            f.seek(start)
            pos = start
            while pos < end:
                limit = end if cut is None else min(end, max(cut, start))
                if pos >= limit:
                    return self._drop()
                data = f.read(min(CHUNK, limit - pos))
                self.wfile.write(data)
                pos += len(data)
        return None

    def _drop(self):
        """Cut the connection mid-body, as a network failure would."""
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def parse_range(value, size):
    """`bytes=a-b`, `bytes=a-` or `bytes=-n` -> (start, end exclusive), None if unsatisfiable."""
    if not value.startswith("bytes=") or "," in value:
        return None
    first, _, last = value[len("bytes="):].partition("-")
    if first == "":
        start, end = max(size - int(last), 0), size
    else:
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    if start >= size or start >= end:
        return None
    return start, end


class Served:
    """A running stand-in serving one object, as the tests see it."""

    def __init__(self, base, credentials, key):
        self.base = base
        self.credentials = credentials
        self.key = key

    def control(self, path):
        """POSTs /_control/<path> (fail?object=...&after=N, fail, reset)."""
        req = urllib.request.Request(f"{self.base}/_control/{path}", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200, r.read()

    def gets(self):
        """How many GETs of the object the stand-in has answered (or cut)."""
        with urllib.request.urlopen(f"{self.base}/_control/stats", timeout=10) as r:
            return json.load(r)["get"].get(self.key, 0)


@contextlib.contextmanager
def serving(folder, path, key):
    """Serves the file `path` as gs://`key` (bucket/name...) from a stand-in in its own
    process, whose storage and credentials file live in `folder`; stops it on exit (and
    it exits by itself if the test process dies)."""
    root = folder / "gcs"
    (root / key).parent.mkdir(parents=True)
    os.symlink(path, root / key)
    creds = folder / "service-account.json"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--root", str(root), "--credentials-out", str(creds),
         "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:"), f"fake_gcs did not start: {url!r}"
        yield Served(url, creds, key)
    finally:
        proc.stdin.close()
        proc.terminate()
        proc.wait(10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="folder holding <bucket>/<key> files")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--credentials-out", help="write object_store's testing service-account file here")
    ap.add_argument("--fail-object", help="key (or bucket/key) whose GETs are cut")
    ap.add_argument("--fail-after-bytes", type=int, help="absolute offset where they are cut")
    ap.add_argument("--exit-on-stdin-eof", action="store_true",
                    help="exit when stdin closes (so a test that dies takes the server along)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    state = State(args.root, args.fail_object, args.fail_after_bytes)
    handler = type("BoundHandler", (Handler,), {"state": state, "verbose": args.verbose})
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    server.daemon_threads = True
    port = server.server_address[1]
    if args.credentials_out:
        creds = {"gcs_base_url": f"http://127.0.0.1:{port}", "disable_oauth": True,
                 "client_email": "", "private_key": "", "private_key_id": ""}
        tmp = args.credentials_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(creds, f)
        os.replace(tmp, args.credentials_out)
    print(f"fake_gcs listening on http://127.0.0.1:{port}", flush=True)
    if args.exit_on_stdin_eof:
        def watch():
            sys.stdin.read()
            os._exit(0)
        threading.Thread(target=watch, daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
