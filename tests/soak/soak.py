#!/usr/bin/env python3
"""Soak test of a running `dsv41 serve` (scripts/soak.sh starts one): steady concurrent load over
loopback for MINUTES (streamed and whole chat / completions / Messages / Responses requests, a
share of them cancelled midway by closing the socket, a share malformed), sampling the server's
RSS every 10 s. Prints one JSON line per sample and a summary; exits 1 on any 5xx (an engine error
reported after a 200 status line counts as one), on a malformed
body not answered 4xx or a well-formed one not answered 200, on connection errors, on KV blocks
still in use once idle, on foreign reads, on RSS growth after warm-up (2 minutes and the KV pool
filled once: the prefix cache's first eviction) of its anonymous memory beyond 2%, or when
the pool never filled. RSS is sampled as a total and split into anonymous and file-backed memory.
Usage: soak.py PORT PID MINUTES"""
import http.client
import json
import random
import re
import sys
import threading
import time

PORT, PID, MINUTES = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
CONCURRENCY = 8
lock = threading.Lock()
counts = {"ok": 0, "cancelled": 0, "429": 0, "4xx": 0, "5xx": 0, "unexpected": 0, "errors": 0}
stop = threading.Event()


def rss_kb():
    """The server's resident memory in kB: total, anonymous (heap, KV pool, stacks) and
    file-backed (mostly the memory-mapped checkpoint, bounded by its size)."""
    out = {}
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1])
    return out


def metrics():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for name in ("dsv41_kv_blocks_used", "dsv41_kv_foreign_reads_total", "dsv41_running_requests",
                 "dsv41_queue_length", "dsv41_prefix_cache_evictions_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else None
    return out


def body(rng):
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "epsilon"]) for _ in range(rng.randint(3, 60)))
    kind = rng.randrange(5)
    stream = rng.random() < 0.5
    if kind == 0:
        return "/v1/completions", {"model": "dsv41-demo", "prompt": words, "max_tokens": rng.randint(1, 24),
                                   "stream": stream, "temperature": rng.choice([0, 0.8]), "seed": rng.randint(0, 99)}
    if kind == 1:
        return "/v1/chat/completions", {"model": "dsv41-demo", "messages": [{"role": "user", "content": words}],
                                        "max_tokens": rng.randint(1, 24), "stream": stream, "n": rng.choice([1, 1, 2]),
                                        "chat_template_kwargs": {"thinking": rng.random() < 0.5}}
    if kind == 2:
        return "/v1/messages", {"model": "dsv41-demo", "max_tokens": rng.randint(1, 24), "stream": stream,
                                "messages": [{"role": "user", "content": words}]}
    if kind == 3:
        return "/v1/responses", {"model": "dsv41-demo", "input": words, "max_output_tokens": rng.randint(1, 24),
                                 "stream": stream}
    # A shared long prefix (prefix cache hits and evictions).
    return "/v1/completions", {"model": "dsv41-demo", "prompt": "shared " * 300 + words, "max_tokens": 4}


MALFORMED = [b"{", b"[]", b'{"model":"dsv41-demo"}', b'{"model":"dsv41-demo","prompt":[-1]}',
             b'{"model":"dsv41-demo","messages":[{"role":"user","content":[]}],"max_tokens":2}',
             b'{"model":"dsv41-demo","input":"x","store":true}', b"\xff\xfe"]


def engine_error(answer):
    """An engine failure after the 200 status line: an error body (OpenAI's {"error": ...},
    Anthropic's {"type": "error", ...}) or an error frame in a stream (OpenAI's data: {"error": ...},
    Anthropic's and Responses' event: error). Generated text cannot match: inside JSON strings
    its quotes are escaped."""
    return (answer.startswith(b'{"error":') or answer.startswith(b'{"type":"error"') or
            b'data: {"error":' in answer or b"event: error\n" in answer)


def worker(seed):
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
            malformed = rng.random() < 0.1
            cancelled = False
            answer = b""
            if malformed:
                path = rng.choice(["/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"])
                c.request("POST", path, body=rng.choice(MALFORMED), headers={"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
            else:
                path, b = body(rng)
                c.request("POST", path, body=json.dumps(b), headers={"Content-Type": "application/json"})
                r = c.getresponse()
                if rng.random() < 0.15:  # hang up midway: the request must be cancelled
                    r.read(16)
                    cancelled = True
                else:
                    answer = r.read()
            c.close()
            # The status first: a 5xx counts whether or not the client then hung up; a malformed
            # body must get a 4xx, a well-formed one a 200.
            with lock:
                if r.status >= 500 or (r.status == 200 and engine_error(answer)):
                    counts["5xx"] += 1
                elif malformed:
                    counts["4xx" if 400 <= r.status < 500 else "unexpected"] += 1
                elif r.status == 429:  # the queue was full: allowed, counted
                    counts["429"] += 1
                elif r.status != 200:
                    counts["unexpected"] += 1
                    print(json.dumps({"unexpected": r.status, "path": path}), flush=True)
                else:
                    counts["cancelled" if cancelled else "ok"] += 1
        except Exception as e:  # a connection error counts against the server
            with lock:
                counts["errors"] += 1
            print(json.dumps({"error": repr(e)}), flush=True)
            time.sleep(0.5)


threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(CONCURRENCY)]
for t in threads:
    t.start()
t0 = time.time()
samples = []
while time.time() - t0 < MINUTES * 60:
    time.sleep(10)
    rss = rss_kb()
    s = {"t_s": round(time.time() - t0), "rss_mb": round(rss.get("VmRSS", 0) / 1024, 1),
         "anon_mb": round(rss.get("RssAnon", 0) / 1024, 1), "file_mb": round(rss.get("RssFile", 0) / 1024, 1),
         "evictions": metrics()["dsv41_prefix_cache_evictions_total"]}
    with lock:
        s.update(counts)
    samples.append(s)
    print(json.dumps(s), flush=True)
stop.set()
for t in threads:
    t.join(timeout=150)
for _ in range(60):  # idle: every block back
    m = metrics()
    if m["dsv41_running_requests"] == 0 and m["dsv41_queue_length"] == 0:
        break
    time.sleep(1)
m = metrics()
# Warm-up: at least 2 minutes and until the prefix cache has first evicted, that is until the KV
# pool has been filled once. Before that RSS grows by design as the pool's pages are first
# written (the cache keeps every prompt's blocks until the pool is full); after it, growth is a leak.
warm_start = next((s["t_s"] for s in samples if s["t_s"] >= min(120, MINUTES * 30) and
                   (s["evictions"] or 0) > 0), None)
# A leak is anonymous memory: the file-backed part is the checkpoint's pages, read as the experts a
# request routes to are first used, and bounded by the checkpoint's size.
warm = [s["anon_mb"] for s in samples if warm_start is not None and s["t_s"] >= warm_start]
growth = (max(warm) - warm[0]) if warm else 0.0
# The tolerance is issue 37's: at most 2% of the anonymous memory at the end of the warm-up.
growth_pct = 100.0 * growth / warm[0] if warm and warm[0] > 0 else 0.0
summary = {"minutes": MINUTES, "requests": dict(counts), "warm_up_ended_s": warm_start, "rss_first_mb": samples[0]["rss_mb"] if samples else None,
           "rss_last_mb": samples[-1]["rss_mb"] if samples else None,
           "anon_after_warmup_mb": warm[0] if warm else None, "anon_max_after_warmup_mb": max(warm) if warm else None,
           "anon_last_mb": samples[-1]["anon_mb"] if samples else None, "anon_growth_after_warmup_mb": round(growth, 1),
           "anon_growth_after_warmup_pct": round(growth_pct, 2),
           "file_first_mb": samples[0]["file_mb"] if samples else None, "file_last_mb": samples[-1]["file_mb"] if samples else None,
           "kv_blocks_used_idle": m["dsv41_kv_blocks_used"], "kv_foreign_reads": m["dsv41_kv_foreign_reads_total"]}
print(json.dumps({"summary": summary}), flush=True)
bad = warm_start is None or counts["5xx"] > 0 or counts["errors"] > 0 or counts["unexpected"] > 0 or m["dsv41_kv_blocks_used"] not in (0, 0.0) or \
    (m["dsv41_kv_foreign_reads_total"] or 0) > 0 or growth_pct > 2.0
sys.exit(1 if bad else 0)
