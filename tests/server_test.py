"""`clawmine serve` end to end on the default model, through the official `openai` client (and raw
HTTP for what a client library would not send): completions and chat, plain and streamed, usage,
stop strings, greedy determinism alone vs 32 concurrent, equality with `clawmine generate`,
abandoned streams, auth, malformed requests, metrics, tokenize, SIGTERM draining, a
200-stream load test with random disconnects (tools/load_test.py --check), and, in the last
section, the Responses API (client.responses.create).

Run: CLAWMINE_BIN=build/clawmine CLAWMINE_MODEL=models/default python -m pytest -q tests/server_test.py
"""
import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import openai
import pytest

BIN = os.environ.get("CLAWMINE_BIN", "build/clawmine")
MODEL = os.environ.get("CLAWMINE_MODEL", "models/default")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "The history of tea"


class Server:
    """A `clawmine serve --port 0` process; the port is read from its startup line."""

    def __init__(self, *extra, model=None):
        self.proc = subprocess.Popen([BIN, "serve", "-m", model or MODEL, "--port", "0", "-t", "2", *extra],
                                     stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"on http://[^:]+:(\d+)", line)
                if m and not ready.is_set():
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        assert ready.wait(60), "server did not start"
        assert self.port, "server exited: " + "".join(self.lines)
        self.base = f"http://127.0.0.1:{self.port}"

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=120)

    def aclient(self, key="none"):
        return openai.AsyncOpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=300)

    def raw(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def metric(self, name):
        _, text = self.raw("GET", "/metrics")
        m = re.search(r"^clawmine:%s\{[^}]*\} (\S+)$" % re.escape(name), text.decode(), re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def srv():
    s = Server("--max-seqs", "8", "--max-step-tokens", "64", "--ctx", "1024")
    yield s
    s.stop()


def model_name(srv):
    return srv.client().models.list().data[0].id


def test_health_and_models(srv):
    assert srv.raw("GET", "/health")[0] == 200
    models = srv.client().models.list().data
    assert [m.id for m in models] == ["default"]


def test_model_retrieve_and_version(srv):
    c = srv.client()
    m = c.models.retrieve("default")
    assert m.id == "default" and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4")
    assert "gpt-4" in str(e.value)
    st, data = srv.raw("GET", "/v1/models/gpt-4")
    err = json.loads(data)["error"]
    assert st == 404 and err["code"] == 404 and err["type"] == "NotFoundError"
    st, data = srv.raw("GET", "/version")
    v = json.loads(data)
    cli = subprocess.run([BIN, "--version"], capture_output=True, text=True, check=True).stdout
    assert st == 200 and f"clawmine {v['version']}\n" in cli and f"commit: {v['commit']}\n" in cli


def test_cors_off_by_default(srv):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://a.example",
                                                         "Access-Control-Request-Method": "POST"})
    r = c.getresponse()
    r.read()
    assert r.status == 204 and r.getheader("Access-Control-Allow-Origin") is None
    c.request("GET", "/v1/models", headers={"Origin": "http://a.example"})
    r = c.getresponse()
    r.read()
    assert r.status == 200 and r.getheader("Access-Control-Allow-Origin") is None
    c.close()


def test_cors_allowed_origins():
    s = Server("--max-seqs", "2", "--api-key", "k", "--allowed-origins", "http://a.example,http://localhost:3000")
    try:
        def req(method, path, origin, body=None, headers=None):
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            c.request(method, path, body=body, headers={"Origin": origin, **(headers or {})})
            r = c.getresponse()
            r.read()
            c.close()
            return r
        # Preflight: no credentials needed, the asked headers echoed.
        r = req("OPTIONS", "/v1/chat/completions", "http://localhost:3000",
                headers={"Access-Control-Request-Method": "POST",
                         "Access-Control-Request-Headers": "authorization,content-type"})
        assert r.status == 204
        assert r.getheader("Access-Control-Allow-Origin") == "http://localhost:3000"
        assert "POST" in r.getheader("Access-Control-Allow-Methods")
        assert r.getheader("Access-Control-Allow-Headers") == "authorization,content-type"
        # The actual request and its errors carry the header; other origins get none.
        r = req("POST", "/v1/completions", "http://a.example", json.dumps({"prompt": "x", "max_tokens": 1}),
                {"Authorization": "Bearer k", "Content-Type": "application/json"})
        assert r.status == 200 and r.getheader("Access-Control-Allow-Origin") == "http://a.example"
        assert r.getheader("Vary") == "Origin"
        r = req("POST", "/v1/completions", "http://a.example", "{}")
        assert r.status == 401 and r.getheader("Access-Control-Allow-Origin") == "http://a.example"
        assert req("GET", "/health", "http://evil.example").getheader("Access-Control-Allow-Origin") is None
    finally:
        s.stop()
    bad = subprocess.run([BIN, "serve", "-m", MODEL, "--allowed-origins", "*,http://a"], capture_output=True, text=True)
    assert bad.returncode == 1 and "--allowed-origins" in bad.stderr


def curl(*args):
    return subprocess.run(["curl", "-s", "-w", "\n%{http_code}", *args], capture_output=True, text=True,
                          check=True).stdout.rsplit("\n", 1)


def test_form_encoded_json_and_content_types(srv):
    url = srv.base + "/v1/completions"
    # `curl -d` sends application/x-www-form-urlencoded; a 30 KB JSON body is read as JSON (no 413).
    body = json.dumps({"prompt": "tea " * 7000 + "end", "max_tokens": 1})
    assert len(body) > 28000
    out, code = curl("-d", body, url)
    assert code == "400" and "maximum context length" in out, out[:300]
    out, code = curl("-d", json.dumps({"prompt": PROMPT, "max_tokens": 2}), url)
    assert code == "200" and json.loads(out)["usage"]["completion_tokens"] >= 1
    out, code = curl("-d", "prompt=hello", url)
    assert code == "415" and "application/json" in json.loads(out)["error"]["message"]
    out, code = curl("-H", "Content-Type: text/plain", "-d", "{}", url)
    assert code == "415" and "text/plain" in json.loads(out)["error"]["message"]
    out, code = curl("-F", "prompt=hello", url)
    assert code == "415"
    assert srv.raw("GET", "/health")[0] == 200


def test_completion_plain_stream_and_usage(srv):
    c = srv.client()
    r = c.completions.create(model="default", prompt=PROMPT, max_tokens=8, temperature=0)
    n_prompt = json.loads(srv.raw("POST", "/tokenize", json.dumps({"prompt": PROMPT}))[1])["count"]
    assert r.usage.prompt_tokens == n_prompt
    assert 1 <= r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason in ("stop", "length")
    text, usage, finish = "", None, None
    for ch in c.completions.create(model="default", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                   stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    assert text == r.choices[0].text
    assert finish == r.choices[0].finish_reason
    assert usage.completion_tokens == r.usage.completion_tokens


def test_chat_plain_and_stream(srv):
    c = srv.client()
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
    r = c.chat.completions.create(model="default", messages=msgs, max_tokens=10, temperature=0)
    m = r.choices[0].message
    assert m.role == "assistant" and isinstance(m.content, str)
    assert r.usage.completion_tokens >= 1
    content, roles = "", []
    for ch in c.chat.completions.create(model="default", messages=msgs, max_tokens=10, temperature=0, stream=True):
        for choice in ch.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            content += choice.delta.content or ""
    assert roles == ["assistant"]
    assert content == m.content
    for mark in ("<think>", "</think>", "DSML", "<｜"):
        assert mark not in content


def test_chat_thinking_keeps_reasoning_apart(srv):
    c = srv.client()
    msgs = [{"role": "user", "content": "Why is the sky blue?"}]
    r = c.chat.completions.create(model="default", messages=msgs, max_tokens=24, temperature=0,
                                  extra_body={"chat_template_kwargs": {"thinking": True}})
    m = r.choices[0].message
    reasoning = m.model_extra.get("reasoning_content")
    assert isinstance(reasoning, str)
    assert m.model_extra.get("reasoning") == reasoning  # vLLM 0.10+'s name, same text
    streamed_r, streamed_c = "", ""
    for ch in c.chat.completions.create(model="default", messages=msgs, max_tokens=24, temperature=0, stream=True,
                                        reasoning_effort="high"):
        for choice in ch.choices:
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning") == extra.get("reasoning_content")
            streamed_r += extra.get("reasoning_content") or ""
            streamed_c += choice.delta.content or ""
    assert streamed_r == reasoning and streamed_c == (m.content or "")
    for mark in ("<think>", "</think>", "DSML"):
        assert mark not in streamed_c and mark not in streamed_r


def test_chat_accepts_tool_results(srv):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = srv.client().chat.completions.create(model="default", messages=msgs, tools=tools, max_tokens=6,
                                             temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    prompt = json.loads(srv.raw("POST", "/tokenize", json.dumps({"messages": msgs}))[1])
    assert prompt["count"] > 10


def test_tokenize_messages_counts_like_chat(srv):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    for extra in ({"tools": tools}, {"chat_template_kwargs": {"thinking": True}},
                  {"tools": tools, "chat_template_kwargs": {"thinking": True}}, {"reasoning_effort": "max"}):
        r = srv.client().chat.completions.create(model="default", messages=msgs, max_tokens=1, temperature=0,
                                                 extra_body=extra)
        st, data = srv.raw("POST", "/tokenize", json.dumps({"messages": msgs, **extra}))
        assert st == 200 and json.loads(data)["count"] == r.usage.prompt_tokens, extra
    plain = json.loads(srv.raw("POST", "/tokenize", json.dumps({"messages": msgs}))[1])["count"]
    with_tools = json.loads(srv.raw("POST", "/tokenize", json.dumps({"messages": msgs, "tools": tools}))[1])["count"]
    assert with_tools > plain + 10


def test_unknown_fields_logged_or_refused(srv):
    n_before = sum("fields this server ignores" in l for l in srv.lines)
    r = srv.client().completions.create(model="default", prompt="x", max_tokens=1, user="alice",
                                        extra_body={"frobnicate": 1})
    assert r.usage.completion_tokens >= 1
    time.sleep(0.2)
    logged = [l for l in srv.lines if "fields this server ignores" in l][n_before:]
    assert len(logged) == 1 and "'frobnicate'" in logged[0] and "user" not in logged[0]
    s = Server("--max-seqs", "2", "--strict-requests")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            s.client().chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}],
                                               max_tokens=1, extra_body={"frobnicate": 1, "wibble": 2})
        assert "'frobnicate', 'wibble'" in str(e.value) and "--strict-requests" in str(e.value)
        assert s.client().completions.create(model="default", prompt="x", max_tokens=1, user="bob").usage
    finally:
        s.stop()


def test_access_log_and_log_file(tmp_path):
    path = tmp_path / "serve.log"
    s = Server("--max-seqs", "2", "--log-file", str(path))
    try:
        c = s.client()
        r = c.completions.create(model="default", prompt=PROMPT, max_tokens=3, temperature=0)
        for _ in c.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2, stream=True):
            pass
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model="default", prompt="x", max_tokens=100000)
    finally:
        s.stop()
    text = path.read_text()
    stamp = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[(info|warning|error|debug)\] "
    assert re.search(stamp + r"clawmine serve: model 'default' on http://", text, re.M), text
    line = re.search(stamp + r"(%s): 200 prompt=(\d+) output=(\d+) ttft=([\d.]+)s finish=(\w+)$" % r.id, text, re.M)
    assert line, text
    assert int(line.group(3)) == r.usage.prompt_tokens and int(line.group(4)) == r.usage.completion_tokens
    assert line.group(6) == r.choices[0].finish_reason
    assert re.search(stamp + r"chatcmpl-\w+: 200 prompt=\d+ output=\d+ ttft=[\d.]+s finish=\w+$", text, re.M), text
    assert re.search(stamp + r"cmpl-\w+: 400 .*maximum context length", text, re.M), text
    assert sum(f"{r.id}: 200 prompt=" in l for l in s.lines) == 1  # the same line on stderr, once


def test_stop_strings(srv):
    c = srv.client()
    full = c.completions.create(model="default", prompt=PROMPT, max_tokens=16, temperature=0,
                                extra_body={"ignore_eos": True}).choices[0].text
    assert len(full) > 8
    stop = full[len(full) // 2:len(full) // 2 + 2]
    r = c.completions.create(model="default", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_min_tokens_and_stop_token_ids(srv):
    # vLLM's extensions: min_tokens keeps EOS (and stop ids) from being sampled until then.
    c = srv.client()
    r = c.completions.create(model="default", prompt=PROMPT, max_tokens=8, temperature=0,
                             extra_body={"min_tokens": 8, "stop_token_ids": [0]})
    assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="default", prompt=PROMPT, max_tokens=8, extra_body={"stop_token_ids": "x"})


def test_greedy_equals_generate(srv):
    n = 12
    out = subprocess.run([BIN, "generate", "-m", MODEL, "-p", PROMPT, "-n", str(n), "--temp", "0", "-t", "2"],
                         capture_output=True, text=True, check=True).stdout
    r = srv.client().completions.create(model="default", prompt=PROMPT, max_tokens=n, temperature=0)
    assert out == PROMPT + r.choices[0].text + "\n"


def test_logprobs(srv):
    c = srv.client()
    r = c.completions.create(model="default", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == 5 and len(lp.top_logprobs) == 5
    for tok_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert tok_lp <= 0 and len(top) == 2
        assert abs(max(top.values()) - tok_lp) < 1e-5  # greedy picks the most likely token
    r = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                  temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 for t in content)


def test_greedy_and_seeded_alone_equal_32_concurrent(srv):
    prompts = [f"{PROMPT} number {i} is" for i in range(32)]
    c = srv.client()

    def args(i):
        return dict(model="default", prompt=prompts[i], max_tokens=6, extra_body={"ignore_eos": True},
                    temperature=0 if i % 2 == 0 else 0.9, seed=1000 + i)

    alone = [c.completions.create(**args(i)).choices[0].text for i in range(32)]

    async def together():
        ac = srv.aclient()
        rs = await asyncio.gather(*(ac.completions.create(**args(i)) for i in range(32)))
        return [r.choices[0].text for r in rs]

    assert asyncio.run(together()) == alone
    assert len(set(alone)) > 16


def test_abandoned_streams_free_their_slots(srv):
    socks = []
    for i in range(6):
        s = socket.create_connection(("127.0.0.1", srv.port))
        body = json.dumps({"prompt": f"{PROMPT} {i}", "max_tokens": 400, "stream": True, "ignore_eos": True,
                           "temperature": 0})
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        s.settimeout(30)
        seen = b""
        while b"data: " not in seen:  # the stream has started
            chunk = s.recv(4096)
            assert chunk, "server closed the stream"
            seen += chunk
        socks.append(s)
    assert srv.metric("num_requests_running") >= 1
    for s in socks:
        s.close()
    deadline = time.time() + 20
    while time.time() < deadline and srv.metric("num_requests_running") != 0:
        time.sleep(0.1)
    assert srv.metric("num_requests_running") == 0
    assert srv.metric("num_requests_waiting") == 0
    _, text = srv.raw("GET", "/metrics")
    n = float(re.search(r'finished_reason="cancelled"\} (\S+)', text.decode()).group(1))
    assert n >= 6
    assert srv.raw("GET", "/health")[0] == 200


def test_abandoned_plain_request_frees_its_slot(srv):
    _, text = srv.raw("GET", "/metrics")
    before = float(re.search(r'finished_reason="cancelled"\} (\S+)', text.decode()).group(1))
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps({"prompt": PROMPT, "max_tokens": 900, "ignore_eos": True, "temperature": 0})
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    deadline = time.time() + 20
    while time.time() < deadline and srv.metric("num_requests_running") != 1:
        time.sleep(0.05)
    s.close()
    while time.time() < deadline and srv.metric("num_requests_running") != 0:
        time.sleep(0.05)
    assert srv.metric("num_requests_running") == 0
    _, text = srv.raw("GET", "/metrics")
    assert float(re.search(r'finished_reason="cancelled"\} (\S+)', text.decode()).group(1)) == before + 1


def test_malformed_requests_then_healthy(srv):
    def err(status, path, body, method="POST", headers=None):
        st, data = srv.raw(method, path, body, headers)
        assert st == status, (path, body, st, data)
        e = json.loads(data)["error"]
        assert e["message"] and e["code"] == status
        return e

    err(400, "/v1/completions", "{not json")
    err(400, "/v1/completions", "[]")
    assert err(400, "/v1/completions", json.dumps({"max_tokens": 3}))["param"] == "prompt"
    assert err(400, "/v1/completions", json.dumps({"prompt": "x", "temperature": 9}))["param"] == "temperature"
    assert err(400, "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 100000}))["param"] == "max_tokens"
    e = err(400, "/v1/completions", json.dumps({"prompt": "x " * 1200}))
    assert e["param"] == "prompt" and "This model's maximum context length is 1024 tokens" in e["message"]
    with pytest.raises(openai.BadRequestError) as too_long:
        srv.client().chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=5000)
    assert "maximum context length is 1024 tokens" in str(too_long.value)
    err(400, "/v1/chat/completions", json.dumps({"messages": "hi"}))
    err(400, "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "top_p": -1}))
    err(400, "/v1/chat/completions", json.dumps({"messages": [{"role": "tool", "content": 5}]}))
    err(400, "/v1/completions", "{\"prompt\": \"\xff\xfe\"}")
    err(400, "/v1/completions", "{\"prompt\": " + "[" * 10000 + "]" * 10000 + "}")
    assert err(404, "/v1/completions", json.dumps({"model": "gpt-4", "prompt": "x"}))["param"] == "model"
    err(404, "/v1/nothing", "{}")
    err(413, "/v1/completions", "x" * (5 << 20))
    err(400, "/detokenize", json.dumps({"tokens": [-1]}))
    with pytest.raises(openai.BadRequestError):
        srv.client().completions.create(model="default", prompt="x", max_tokens=2, n=17)
    # Garbage on the wire, and a client that sends half a request and leaves.
    for junk in (b"\x00\x01\x02garbage\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro"):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(junk)
        s.close()
    assert srv.raw("GET", "/health")[0] == 200
    r = srv.client().completions.create(model="default", prompt=PROMPT, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_tokenize_detokenize(srv):
    st, data = srv.raw("POST", "/tokenize", json.dumps({"prompt": "Hello world"}))
    toks = json.loads(data)["tokens"]
    assert st == 200 and len(toks) >= 2
    st, data = srv.raw("POST", "/detokenize", json.dumps({"tokens": toks}))
    assert json.loads(data)["prompt"] == "Hello world"


def test_metrics(srv):
    srv.client().completions.create(model="default", prompt=PROMPT, max_tokens=2, temperature=0)
    _, text = srv.raw("GET", "/metrics")
    text = text.decode()
    for name in ("num_requests_running", "num_requests_waiting", "prompt_tokens_total", "generation_tokens_total",
                 "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                 "prefix_cache_hits_total", "prefix_cache_queries_total", "e2e_request_latency_seconds_count",
                 "engine_steps_total", "engine_step_tokens_total"):
        assert re.search(r"^clawmine:%s\{" % name, text, re.M), name
    assert srv.metric("generation_tokens_total") > 0
    assert srv.metric("engine_steps_total") > 0
    parts = dict(re.findall(r'^clawmine:engine_step_seconds_total\{[^}]*part="(\w+)"\} (\S+)$', text, re.M))
    assert set(parts) == {"backend", "sample", "engine"} and float(parts["backend"]) > 0, parts
    assert srv.metric("prompt_tokens_total") > 0


def test_prefix_reuse_counts_hits(srv):
    c = srv.client()
    msgs = [{"role": "user", "content": "Tell me about rivers and mountains in detail."}]
    hits0 = srv.metric("prefix_cache_hits_total")
    r1 = c.chat.completions.create(model="default", messages=msgs, max_tokens=6, temperature=0)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content or ""},
             {"role": "user", "content": "And about lakes?"}]
    r2 = c.chat.completions.create(model="default", messages=msgs, max_tokens=4, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens > 0
    assert srv.metric("prefix_cache_hits_total") > hits0


def test_shared_system_prompt_is_cached(srv):
    # Requests with one system prompt and different questions: from the third on, the system prompt's
    # state comes from the snapshot the second left (the first has nothing to share with), and the
    # answers are those of a server that caches nothing.
    c = srv.client()
    system = {"role": "system", "content": "You are a careful assistant who answers questions about the "
              "rivers, lakes, hills and mountains of the old world in short plain sentences, always."}
    questions = ["Which river is longest?", "Name a tall mountain.", "What is a lake?", "Where do hills come from?"]
    cached, answers = [], []
    for q in questions:
        r = c.chat.completions.create(model="default", messages=[system, {"role": "user", "content": q}],
                                      max_tokens=5, temperature=0)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        answers.append(r.choices[0].message.content)
    assert cached[2] >= 32 and cached[3] >= 32, cached
    off = Server("--max-seqs", "4", "--max-step-tokens", "64", "--ctx", "1024", "--no-enable-prefix-caching")
    try:
        for q, want in zip(questions, answers):
            r = off.client().chat.completions.create(model="default", messages=[system, {"role": "user", "content": q}],
                                                     max_tokens=5, temperature=0)
            assert r.usage.prompt_tokens_details.cached_tokens == 0
            assert r.choices[0].message.content == want
    finally:
        off.stop()


def test_auth():
    s = Server("--api-key", "sekret", "--max-seqs", "2")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.raw("POST", "/v1/completions", json.dumps({"prompt": "x"}))[0] == 401
        assert s.raw("POST", "/tokenize", json.dumps({"prompt": "x"}))[0] == 401
        assert s.client("sekret").completions.create(model="default", prompt="x", max_tokens=1).usage
        assert s.raw("GET", "/health")[0] == 200
    finally:
        s.stop()


def test_sigterm_drains():
    s = Server("--max-seqs", "2")
    got, started = [], threading.Event()

    def stream():
        for ch in s.client().completions.create(model="default", prompt=PROMPT, max_tokens=400, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True},
                                                stream_options={"include_usage": True}):
            started.set()
            if ch.usage:
                got.append(ch.usage.completion_tokens)

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(30)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # Draining: new requests are refused while the running one goes on.
    st, body = s.raw("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1}))
    t.join(60)
    assert got == [400]  # the running request finished in full
    assert st == 503 and b"shutting down" in body
    assert s.proc.wait(30) == 0
    assert any("draining" in l for l in s.lines)


def test_load_200_streams_with_disconnects(srv):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "load_test.py"), "--base-url", srv.base + "/v1",
                        "--n", "200", "--concurrency", "200", "--max-tokens", "6", "--disconnect", "0.25",
                        "--check", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    print("load test:", summary)
    assert summary["errors"] == 0 and summary["problems"] == 0
    assert summary["finished"] + summary["abandoned"] == 200


# ---------------------------------------------------------------------------------------------
# Sampling fields: logit_bias, n, best_of, echo, prompt lists (issue 27, item 2).

def fields_tokenize(srv, text):
    st, data = srv.raw("POST", "/tokenize", json.dumps({"prompt": text}), {"Content-Type": "application/json"})
    assert st == 200
    return json.loads(data)["tokens"]


def test_fields_logit_bias_bans_the_greedy_token(srv):
    c = srv.client()
    prompt = f"{PROMPT} and its"
    ptoks = fields_tokenize(srv, prompt)
    # The greedy first token's id: the ids of prompt + answer minus the prompt's.
    g = c.completions.create(model="default", prompt=ptoks, max_tokens=1, temperature=0,
                             extra_body={"ignore_eos": True})
    ids = fields_tokenize(srv, prompt + g.choices[0].text)
    assert ids[:len(ptoks)] == ptoks and len(ids) == len(ptoks) + 1, (g.choices[0].text, ids)
    banned = ids[-1]
    for body in ({}, {"logit_bias": {str(banned): -100}}):
        r = c.completions.create(model="default", prompt=ptoks, max_tokens=1, temperature=0,
                                 extra_body={"ignore_eos": True, **body})
        again = fields_tokenize(srv, prompt + r.choices[0].text)
        assert (again[-1] == banned) == (not body), (body, again)
    # +100 forces a token (chat too): the answer is that token over and over.
    forced = fields_tokenize(srv, " tea")[-1]
    st, data = srv.raw("POST", "/detokenize", json.dumps({"tokens": [forced]}), {"Content-Type": "application/json"})
    piece = json.loads(data)["prompt"]
    r = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                  temperature=1, logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    assert piece and r.choices[0].message.content == piece * 3


def test_fields_n_choices_differ_and_prefill_once(srv):
    c = srv.client()
    prompt = f"Quokka zeppelin {time.time_ns()} says"  # unseen: nothing to reuse but the forks' copies
    hits0 = srv.metric("prefix_cache_hits_total")
    r = c.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=1, seed=7, n=3,
                             extra_body={"ignore_eos": True})
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    texts = [ch.text for ch in r.choices]
    assert len(set(texts)) == 3, texts
    n_prompt = len(fields_tokenize(srv, prompt))
    assert r.usage.prompt_tokens == n_prompt  # counted once
    assert r.usage.completion_tokens == 24
    # Choices 1 and 2 copied choice 0's prompt state (all but the last token) instead of prefilling it.
    assert srv.metric("prefix_cache_hits_total") - hits0 == 2 * (n_prompt - 1)
    # The same seed gives the same three; choice 0 is the n = 1 answer of that seed.
    again = c.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=1, seed=7, n=3,
                                 extra_body={"ignore_eos": True})
    assert [ch.text for ch in again.choices] == texts
    one = c.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=1, seed=7,
                               extra_body={"ignore_eos": True})
    assert one.choices[0].text == texts[0]
    g = c.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0, n=3)
    assert len({ch.text for ch in g.choices}) == 1
    ch = c.chat.completions.create(model="default", messages=[{"role": "user", "content": prompt}], max_tokens=4,
                                   temperature=0, n=2)
    assert [x.index for x in ch.choices] == [0, 1]
    assert ch.choices[0].message.content == ch.choices[1].message.content


def test_fields_stream_n2_yields_both_indices(srv):
    c = srv.client()
    texts, finished = {}, {}
    usage = None
    for chunk in c.completions.create(model="default", prompt=PROMPT, max_tokens=6, temperature=1, seed=3, n=2,
                                      stream=True, stream_options={"include_usage": True},
                                      extra_body={"ignore_eos": True}):
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                finished[ch.index] = ch.finish_reason
    assert sorted(texts) == [0, 1] and finished == {0: "length", 1: "length"}
    assert usage.completion_tokens == 12
    plain = c.completions.create(model="default", prompt=PROMPT, max_tokens=6, temperature=1, seed=3, n=2,
                                 extra_body={"ignore_eos": True})
    assert [texts[0], texts[1]] == [ch.text for ch in plain.choices]
    roles = set()
    for chunk in c.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3, n=2, stream=True):
        for ch in chunk.choices:
            roles.add(ch.index)
    assert roles == {0, 1}


def test_fields_best_of_keeps_the_most_likely(srv):
    c = srv.client()
    kw = dict(model="default", prompt=PROMPT, max_tokens=6, temperature=1, seed=11, extra_body={"ignore_eos": True})
    cands = c.completions.create(n=3, logprobs=0, **kw)
    scores = [sum(ch.logprobs.token_logprobs) for ch in cands.choices]
    best = c.completions.create(n=1, best_of=3, **kw)
    assert len(best.choices) == 1 and best.choices[0].index == 0
    assert best.choices[0].text == cands.choices[scores.index(max(scores))].text
    assert best.choices[0].logprobs is None
    assert best.usage.completion_tokens == 18  # every candidate's tokens


def test_fields_echo_returns_prompt_and_its_logprobs(srv):
    c = srv.client()
    plain = c.completions.create(model="default", prompt=PROMPT, max_tokens=4, temperature=0,
                                 extra_body={"ignore_eos": True})
    r = c.completions.create(model="default", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=1,
                             extra_body={"ignore_eos": True})
    ch = r.choices[0]
    assert ch.text == PROMPT + plain.choices[0].text
    lp = ch.logprobs
    assert len(lp.tokens) == r.usage.prompt_tokens + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert "".join(lp.tokens[:r.usage.prompt_tokens]) == PROMPT
    assert lp.text_offset[0] == 0 and lp.text_offset[r.usage.prompt_tokens] == len(PROMPT.encode())
    # The prompt's logprobs are the model's: the greedy continuation's logprobs reappear when that
    # continuation is echoed as part of the prompt.
    gen = c.completions.create(model="default", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0,
                               extra_body={"ignore_eos": True})
    ext = c.completions.create(model="default", prompt=PROMPT + gen.choices[0].text, max_tokens=1, temperature=0,
                               echo=True, logprobs=0, extra_body={"ignore_eos": True})
    n_ext = ext.usage.prompt_tokens
    if n_ext == r.usage.prompt_tokens + 3:  # the text re-tokenizes to the same ids
        for a, b in zip(ext.choices[0].logprobs.token_logprobs[n_ext - 3:n_ext], gen.choices[0].logprobs.token_logprobs):
            assert abs(a - b) < 1e-3
    s = "".join(x.choices[0].text for x in c.completions.create(
        model="default", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, stream=True,
        extra_body={"ignore_eos": True}) if x.choices)
    assert s == ch.text


def test_fields_prompt_lists(srv):
    c = srv.client()
    prompts = [PROMPT, "Rivers of the world"]
    alone = [c.completions.create(model="default", prompt=p, max_tokens=5, temperature=0).choices[0].text
             for p in prompts]
    r = c.completions.create(model="default", prompt=prompts, max_tokens=5, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1] and [ch.text for ch in r.choices] == alone
    assert r.usage.prompt_tokens == sum(len(fields_tokenize(srv, p)) for p in prompts)
    r = c.completions.create(model="default", prompt=[fields_tokenize(srv, p) for p in prompts], max_tokens=5,
                             temperature=0, n=2)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert [ch.text for ch in r.choices] == [alone[0], alone[0], alone[1], alone[1]]
    one = c.completions.create(model="default", prompt=[PROMPT], max_tokens=5, temperature=0)
    assert [ch.text for ch in one.choices] == alone[:1]


def test_fields_validation_errors(srv):
    c = srv.client()
    bad = [({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"5": 200}}, "logit_bias"),
           ({"logit_bias": {"99999999": 1}}, "logit_bias"), ({"n": 0}, "n"), ({"n": 99}, "n"),
           ({"n": 3, "best_of": 2}, "best_of"), ({"best_of": 3, "stream": True}, "best_of"),
           ({"echo": "yes"}, "echo"), ({"prompt": []}, "prompt"), ({"prompt": [[1, 2], [-3]]}, "prompt")]
    for extra, param in bad:
        body = {"prompt": PROMPT, "max_tokens": 2, **extra}
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="default", **{k: v for k, v in body.items() if k == "prompt"},
                                 extra_body={k: v for k, v in body.items() if k != "prompt"})
        assert e.value.body["param"] == param, (extra, e.value.body)
    assert srv.raw("GET", "/health")[0] == 200


def test_fields_more_choices_than_slots():
    s = Server("--max-seqs", "2", "--max-step-tokens", "64", "--ctx", "512")
    try:
        c = s.client()
        r = c.completions.create(model="default", prompt=PROMPT, max_tokens=6, temperature=1, seed=5, n=5,
                                 extra_body={"ignore_eos": True})
        assert [ch.index for ch in r.choices] == [0, 1, 2, 3, 4]
        assert all(ch.finish_reason == "length" for ch in r.choices)
        assert r.usage.completion_tokens == 30
        # Each choice is its seed's answer whatever the slots: n = 5 on 2 slots equals n = 5 on 8.
        r8 = Server("--max-seqs", "8", "--max-step-tokens", "64", "--ctx", "512")
        try:
            big = r8.client().completions.create(model="default", prompt=PROMPT, max_tokens=6, temperature=1, seed=5,
                                                 n=5, extra_body={"ignore_eos": True})
        finally:
            r8.stop()
        assert [ch.text for ch in r.choices] == [ch.text for ch in big.choices]
    finally:
        s.stop()

# POST /v1/responses (OpenAI's Responses API, mapped onto the chat path): the official client's
# responses.create, plain and streamed, with instructions, input items, tools and reasoning; the
# bodies and events also validated against the client's own pydantic types, strictly.
from openai.types.responses import Response as ResponsesResponse  # noqa: E402
from openai.types.responses import ResponseStreamEvent  # noqa: E402
import pydantic  # noqa: E402

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def responses_raw(srv, body):
    """POST /v1/responses: (status, parsed JSON) plain, or (status, [(event, data)]) streamed."""
    st, data = srv.raw("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
    if not body.get("stream") or st != 200:
        return st, json.loads(data)
    events = []
    for block in data.decode().split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        head, payload = block.split("\n", 1)
        assert head.startswith("event: ") and payload.startswith("data: "), block
        events.append((head[7:], json.loads(payload[6:])))
    return st, events


def chat_count(srv, msgs, **extra):
    return json.loads(srv.raw("POST", "/tokenize", json.dumps({"messages": msgs, **extra}))[1])["count"]


def test_responses_plain_output_text_and_usage(srv):
    r = srv.client().responses.create(model="default", input=PROMPT, max_output_tokens=8, temperature=0)
    assert isinstance(r, ResponsesResponse)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "default"
    assert r.status in ("completed", "incomplete") and r.error is None
    msg = [o for o in r.output if o.type == "message"]
    assert len(msg) == 1 and msg[0].role == "assistant" and msg[0].content[0].type == "output_text"
    assert isinstance(r.output_text, str) and r.output_text == msg[0].content[0].text
    assert r.usage.input_tokens == chat_count(srv, [{"role": "user", "content": PROMPT}])
    assert 1 <= r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.max_output_tokens == 8 and r.temperature == 0 and r.tools == [] and r.tool_choice == "auto"
    # The raw body passes the client's types strictly (not just its lenient construct()).
    st, body = responses_raw(srv, {"model": "default", "input": PROMPT, "max_output_tokens": 8, "temperature": 0,
                                   "metadata": {"run": "1"}, "store": False, "user": "alice"})
    assert st == 200
    ResponsesResponse.model_validate(body)
    assert body["output"][-1]["content"][0]["text"] == r.output_text  # greedy: the same answer again
    assert body["metadata"] == {"run": "1"} and body["user"] == "alice" and body["store"] is False


def test_responses_equal_chat_for_the_same_messages(srv):
    c = srv.client()
    chat_msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
    chat = c.chat.completions.create(model="default", messages=chat_msgs, max_tokens=10, temperature=0)
    r = c.responses.create(model="default", instructions="You are brief.", input="Name a colour.",
                           max_output_tokens=10, temperature=0)
    assert r.instructions == "You are brief."
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    # A list of input items (typed content parts, an earlier assistant turn) is the same conversation.
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
               {"role": "user", "content": "Name a colour."}]
    chat = c.chat.completions.create(model="default", messages=history, max_tokens=10, temperature=0)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]},
             {"role": "user", "content": "Name a colour."}]
    r = c.responses.create(model="default", input=items, max_output_tokens=10, temperature=0)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_responses_stream_events_in_order(srv):
    c = srv.client()
    plain = c.responses.create(model="default", input=PROMPT, max_output_tokens=12, temperature=0)
    events = list(c.responses.create(model="default", input=PROMPT, max_output_tokens=12, temperature=0,
                                     stream=True))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    end = "response.completed" if plain.status == "completed" else "response.incomplete"
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          end]
    assert set(types[4:-4]) == {"response.output_text.delta"} and len(types[4:-4]) >= 1
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == deltas == plain.output_text
    assert events[-4].text == deltas and events[-2].item.content[0].text == deltas
    assert {e.item_id for e in events if e.type == "response.output_text.delta"} == {final.output[0].id}
    assert final.id == events[0].response.id and final.usage.output_tokens == plain.usage.output_tokens
    # Every event's JSON passes the client's event types strictly.
    st, raw = responses_raw(srv, {"input": PROMPT, "max_output_tokens": 12, "temperature": 0, "stream": True})
    assert st == 200 and [t for t, _ in raw] == types
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    for t, data in raw:
        assert data["type"] == t
        adapter.validate_python(data)


def test_responses_max_output_tokens_is_incomplete(srv):
    c = srv.client()
    r = c.responses.create(model="default", input=PROMPT, max_output_tokens=3, temperature=0,
                           extra_body={"ignore_eos": True})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[-1].status == "incomplete"
    events = list(c.responses.create(model="default", input=PROMPT, max_output_tokens=3, temperature=0, stream=True,
                                     extra_body={"ignore_eos": True}))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == r.output_text


def test_responses_reasoning_item_matches_chat_thinking(srv):
    c = srv.client()
    msgs = [{"role": "user", "content": "Why is the sky blue?"}]
    chat = c.chat.completions.create(model="default", messages=msgs, max_tokens=16, temperature=0,
                                     reasoning_effort="high")
    r = c.responses.create(model="default", input="Why is the sky blue?", max_output_tokens=16, temperature=0,
                           reasoning={"effort": "high"})
    reasoning = chat.choices[0].message.model_extra["reasoning_content"]
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    items = [o for o in r.output if o.type == "reasoning"]
    assert items and items[0].content[0].text == reasoning and r.output[0].type == "reasoning"
    assert r.output_text == (chat.choices[0].message.content or "")
    assert 1 <= r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    assert r.reasoning.effort == "high"
    events = list(c.responses.create(model="default", input="Why is the sky blue?", max_output_tokens=16,
                                     temperature=0, reasoning={"effort": "high"}, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == reasoning
    assert [e.text for e in events if e.type == "response.reasoning_text.done"] == [reasoning]
    assert events[-1].response.output[0].content[0].text == reasoning
    for mark in ("<think>", "</think>", "DSML"):
        assert mark not in streamed and mark not in r.output_text


def test_responses_tool_round_trip(srv):
    c = srv.client()
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": "{\"city\": \"Paris\"}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}]
    r = c.responses.create(model="default", input=items, tools=[WEATHER_TOOL], max_output_tokens=6, temperature=0)
    assert r.status in ("completed", "incomplete")
    assert [t.name for t in r.tools] == ["get_weather"] and r.parallel_tool_calls is True
    chat_msgs = [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": "", "tool_calls": [
                     {"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    chat_tool = {"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}
    assert r.usage.input_tokens == chat_count(srv, chat_msgs, tools=[chat_tool])
    chat = c.chat.completions.create(model="default", messages=chat_msgs, tools=[chat_tool], max_tokens=6,
                                     temperature=0)
    assert r.output_text == (chat.choices[0].message.content or "")
    # tool_choice naming the function is accepted; output items keep their order and ids.
    r = c.responses.create(model="default", input="Weather in Paris?", tools=[WEATHER_TOOL], max_output_tokens=4,
                           tool_choice={"type": "function", "name": "get_weather"})
    assert r.tool_choice.name == "get_weather"
    assert r.output and all(r.id[len("resp_"):] in o.id for o in r.output)  # item ids share the response's


def test_responses_malformed_input(srv):
    c = srv.client()
    bad = [({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
           ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
           ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "input[0].content[0].type"),
           ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
           ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
           ({"input": "x", "max_output_tokens": 5000}, "max_output_tokens"),
           ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
           ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
           ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
           ({"input": 5}, "input"),
           ({"instructions": "x"}, "input")]
    for body, param in bad:
        st, data = responses_raw(srv, body)
        assert st == 400 and data["error"]["param"] == param and data["error"]["code"] == 400, (body, data)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="default", input=[{"role": "user"}])
    assert "input[0].content" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="default", input="x", previous_response_id="resp_123")
    assert "stored responses are not supported" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="default", input="x " * 1200)
    assert "maximum context length is 1024 tokens" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="gpt-4", input="x")
    assert srv.raw("POST", "/v1/responses", "{not json", {"Content-Type": "application/json"})[0] == 400
    assert c.responses.create(model="default", input="x", max_output_tokens=2).usage.output_tokens >= 1


def test_responses_unknown_fields_logged(srv):
    n_before = sum("fields this server ignores" in l for l in srv.lines)
    r = srv.client().responses.create(model="default", input="x", max_output_tokens=1,
                                      extra_body={"frobnicate": 1})
    assert r.usage.output_tokens == 1
    time.sleep(0.2)
    logged = [l for l in srv.lines if "fields this server ignores" in l][n_before:]
    assert len(logged) == 1 and "resp_" in logged[0] and "'frobnicate'" in logged[0]


def test_responses_abandoned_stream_frees_its_slot(srv):
    _, text = srv.raw("GET", "/metrics")
    before = float(re.search(r'finished_reason="cancelled"\} (\S+)', text.decode()).group(1))
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps({"input": PROMPT, "max_output_tokens": 900, "stream": True, "ignore_eos": True,
                       "temperature": 0})
    s.sendall((f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    s.settimeout(30)
    seen = b""
    while b"response.output_text.delta" not in seen:  # tokens are flowing
        chunk = s.recv(4096)
        assert chunk, "server closed the stream"
        seen += chunk
    assert b"event: response.created" in seen
    s.close()
    deadline = time.time() + 20
    while time.time() < deadline and srv.metric("num_requests_running") != 0:
        time.sleep(0.05)
    assert srv.metric("num_requests_running") == 0
    _, text = srv.raw("GET", "/metrics")
    assert float(re.search(r'finished_reason="cancelled"\} (\S+)', text.decode()).group(1)) >= before + 1

# ---- Structured output (docs/structured-output.md): every sampled output must conform, even from
# the default model, which is random and writes gibberish on its own.

import concurrent.futures
import enum
import typing

import pydantic


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Inner(pydantic.BaseModel):
    ok: bool
    n: int = pydantic.Field(ge=-5, le=5)


class Answer(pydantic.BaseModel):
    # Bounded strings and arrays: a random model rarely closes a string on its own, so the schema
    # bounds what the grammar lets it write (an unbounded one may end "length", see the docs).
    name: str = pydantic.Field(max_length=8)
    color: Color
    tags: typing.List[typing.Annotated[int, pydantic.Field(ge=0, le=99)]] = pydantic.Field(max_length=3)
    inner: Inner


def _parse_one(srv, seed):
    return srv.client().chat.completions.parse(
        model="default", messages=[{"role": "user", "content": "Describe a thing."}], response_format=Answer,
        max_tokens=300, temperature=1.0, seed=seed)


def test_structured_pydantic_parse_20_seeds(srv):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda s: _parse_one(srv, s), range(20)))
    texts = set()
    for r in results:
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        a = choice.message.parsed
        assert isinstance(a, Answer)
        assert len(a.name) <= 8 and len(a.tags) <= 3 and all(0 <= t <= 99 for t in a.tags)
        assert -5 <= a.inner.n <= 5
        # The text itself is the JSON (no markup), and validates on its own.
        assert Answer.model_validate_json(choice.message.content) == a
        texts.add(choice.message.content)
    assert len(texts) > 10  # seeds differ, so the outputs do


def test_structured_json_object_and_completions(srv):
    c = srv.client()
    stopped = 0
    for seed in range(6):
        r = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "JSON please"}],
                                      response_format={"type": "json_object"}, max_tokens=200, temperature=1.0,
                                      seed=seed)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert text.startswith("{")
        if finish == "stop":
            assert isinstance(json.loads(text), dict)
            stopped += 1
        else:
            # Any object is unbounded: a string may run to max_tokens, cut short (as with OpenAI).
            assert finish == "length"
    assert stopped >= 1
    # /v1/completions takes the same fields (llama.cpp's json_schema here).
    schema = {"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["k"]}
    for seed in range(3):
        r = c.completions.create(model="default", prompt=PROMPT, max_tokens=50, temperature=1.0, seed=seed,
                                 extra_body={"json_schema": schema})
        assert r.choices[0].finish_reason == "stop"
        assert 0 <= json.loads(r.choices[0].text)["k"] <= 9


def test_structured_vllm_guided_regex_and_choice(srv):
    c = srv.client()
    for seed in range(5):
        r = c.completions.create(model="default", prompt=PROMPT, max_tokens=50, temperature=1.0, seed=seed,
                                 extra_body={"guided_regex": "[a-c]{3}-[0-9]{2,4}"})
        assert re.fullmatch("[a-c]{3}-[0-9]{2,4}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
        r = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "pick"}], max_tokens=20,
                                      temperature=1.0, seed=seed,
                                      extra_body={"guided_choice": ["yes", "no", "maybe not"]})
        assert r.choices[0].message.content in ("yes", "no", "maybe not")
        r = c.completions.create(model="default", prompt=PROMPT, max_tokens=20, temperature=1.0, seed=seed,
                                 extra_body={"structured_outputs": {"grammar": 'root ::= "x" [0-9] ("," [0-9])?'}})
        assert re.fullmatch(r"x[0-9](,[0-9])?", r.choices[0].text)
    # min_tokens does not fight the grammar: a complete "no" still ends, with "stop".
    r = c.completions.create(model="default", prompt=PROMPT, max_tokens=20, temperature=1.0, seed=1,
                             extra_body={"guided_choice": ["no"], "min_tokens": 10})
    assert r.choices[0].text == "no" and r.choices[0].finish_reason == "stop"


def test_structured_errors_name_the_field(srv):
    c = srv.client()
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="default", messages=msgs, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}})
    assert e.value.body["param"] == "response_format" and "frobnicate" in e.value.body["message"]
    assert "response_format.json_schema.schema" in e.value.body["message"]
    def err(path, body):
        st, data = srv.raw("POST", path, json.dumps(body))
        assert st == 400, (body, data)
        return json.loads(data)["error"]
    assert err("/v1/completions", {"prompt": "x", "guided_regex": "[a-"})["param"] == "guided_regex"
    assert err("/v1/completions", {"prompt": "x", "guided_choice": "yes"})["param"] == "guided_choice"
    e2 = err("/v1/completions", {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})
    assert "guided_choice" in e2["message"] and "guided_regex" in e2["message"]
    assert err("/v1/chat/completions", {"messages": msgs, "grammar": "root ::= nothing"})["param"] == "grammar"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert err("/v1/chat/completions", {"messages": msgs, "tools": tools, "tool_choice": {
        "type": "function", "function": {"name": "g"}}})["param"] == "tool_choice"
    assert err("/v1/chat/completions", {"messages": msgs, "tool_choice": "required"})["param"] == "tool_choice"
    assert err("/v1/chat/completions", {"messages": msgs, "tools": tools, "tool_choice": "required",
                                        "guided_regex": "a"})["param"] == "tool_choice"
    # These fields are read now: not logged as unknown.
    n_before = sum("fields this server ignores" in l for l in srv.lines)
    c.completions.create(model="default", prompt="x", max_tokens=3, extra_body={"guided_choice": ["a"]})
    time.sleep(0.2)
    assert sum("fields this server ignores" in l for l in srv.lines) == n_before
    assert srv.raw("GET", "/health")[0] == 200


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string", "maxLength": 5},
                                         "exact": {"type": "boolean"}}, "required": ["tz"]}}},
]


def _check_call(call):
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert args["city"] in ("Paris", "Tokyo") and 1 <= args["days"] <= 7 and set(args) == {"city", "days"}
    else:
        assert call.function.name == "get_time" and len(args["tz"]) <= 5 and set(args) <= {"tz", "exact"}


@pytest.fixture(scope="module")
def srv_long():
    # The tools block makes a long prompt, and the default model's vocabulary has the DSML markers
    # only as special tokens, which the grammar spells byte by byte (about 100 tokens a call);
    # "required" may call several times before it closes the block.
    s = Server("--max-seqs", "4", "--ctx", "4096")
    yield s
    s.stop()


def test_structured_tool_choice_required_and_named(srv_long):
    c = srv_long.client()
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for seed in range(4):
        r = c.chat.completions.create(model="default", messages=msgs, tools=TOOLS, tool_choice="required",
                                      max_tokens=2000, temperature=1.0, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls and not ch.message.content, ch
        for call in ch.message.tool_calls:
            _check_call(call)
        r = c.chat.completions.create(model="default", messages=msgs, tools=TOOLS, max_tokens=400, temperature=1.0,
                                      seed=seed, tool_choice={"type": "function", "function": {"name": "get_time"}})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1
        assert ch.message.tool_calls[0].function.name == "get_time"
        _check_call(ch.message.tool_calls[0])
    # Streamed, the call arrives as a tool_calls delta.
    calls, finish = [], None
    for chunk in c.chat.completions.create(model="default", messages=msgs, tools=TOOLS, max_tokens=400, seed=9,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           stream=True):
        for ch in chunk.choices:
            calls += ch.delta.tool_calls or []
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" and [x.function.name for x in calls] == ["get_weather"]
    _check_call(calls[0])
