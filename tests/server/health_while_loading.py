#!/usr/bin/env python3
"""`dsv41 serve` answers while it loads (issue 37 item 5): started on a fresh cache it first makes
the demo model (seconds), yet /health must answer 503 {"status": "loading", "progress": ...} within
a second of the process's start, every later poll must connect (no refused connection) until it
answers 200, an API route says 503 with Retry-After meanwhile, and the model then serves; a
SIGTERM while loading ends it at once with status 0.
Usage: health_while_loading.py DSV41_BINARY CACHE_DIR"""
import json, os, re, signal, subprocess, sys, time, urllib.error, urllib.request

binary, cache = sys.argv[1], sys.argv[2]
log_path = os.path.join(cache, "serve.log")
os.makedirs(cache, exist_ok=True)
env = dict(os.environ, DSV41_CACHE=cache)
t0 = time.monotonic()
proc = subprocess.Popen([binary, "serve", "--port", "0"], env=env, stderr=open(log_path, "w"))


def fail(msg):
    proc.kill()
    print("FAIL:", msg)
    print(open(log_path).read())
    sys.exit(1)


port = None
while port is None and time.monotonic() - t0 < 10:
    m = re.search(r"accepting connections on 127\.0\.0\.1:(\d+)", open(log_path).read())
    port = int(m.group(1)) if m else None
    time.sleep(0.01)
if port is None:
    fail("no 'accepting connections' line within 10 s")


def get(path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


first, loading, api_checked = None, 0, False
while time.monotonic() - t0 < 120:
    try:
        code, body, headers = get("/health")
    except OSError as e:  # refused, reset: what a probe must never see
        fail(f"/health did not connect after {time.monotonic() - t0:.2f} s: {e}")
    if first is None:
        first = time.monotonic() - t0
        if code != 503:
            fail(f"the first /health answered {code}, not 503 loading (the model loads for seconds)")
    if code == 200:
        break
    j = json.loads(body)
    if code != 503 or j.get("status") != "loading" or not j["progress"].get("stage"):
        fail(f"/health while loading: {code} {body}")
    loading += 1
    if not api_checked:
        c, b, h = get("/v1/models")
        if c != 503 or "Retry-After" not in h or "loading" not in json.loads(b)["error"]["message"]:
            fail(f"/v1/models while loading: {c} {h} {b}")
        api_checked = True
    time.sleep(0.05)
else:
    fail("/health never answered 200")
if first > 1.0:
    fail(f"the first /health answer came {first:.2f} s after the start (want within 1 s)")
code, body, _ = get("/v1/models")
if code != 200 or json.loads(body)["data"][0]["id"] != "dsv41-demo":
    fail(f"/v1/models once loaded: {code} {body}")
proc.send_signal(signal.SIGTERM)
if proc.wait(timeout=60) != 0:
    fail(f"serve exited {proc.returncode} on SIGTERM")
print(f"ok: /health 503 loading {loading} times (first after {first:.2f} s), then 200; no refused connection")

# SIGTERM while loading (a fresh cache again): serve stops at once with status 0.
cache2 = cache + "-again"
os.makedirs(cache2, exist_ok=True)
log_path = os.path.join(cache2, "serve.log")
proc = subprocess.Popen([binary, "serve", "--port", "0"], env=dict(env, DSV41_CACHE=cache2),
                        stderr=open(log_path, "w"))
t1 = time.monotonic()
while "accepting connections" not in open(log_path).read():
    if time.monotonic() - t1 > 10:
        fail("no 'accepting connections' line within 10 s (second start)")
    time.sleep(0.01)
proc.send_signal(signal.SIGTERM)
try:
    rc = proc.wait(timeout=10)
except subprocess.TimeoutExpired:
    fail("SIGTERM while loading: serve still runs after 10 s")
said = open(log_path).read()
if rc != 0 or "while loading the model: stopping" not in said or "listening on http" in said:
    fail(f"SIGTERM while loading: exit {rc}")
print(f"ok: SIGTERM while loading ends serve at once ({time.monotonic() - t1:.2f} s), status 0")
print("all checks passed")
