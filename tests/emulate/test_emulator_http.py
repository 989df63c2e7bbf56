"""The emulator's OpenAI endpoints against real servers on 127.0.0.1 (OpenAI SDK and httpx)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from test_emulator_support import MODEL, metrics, running, user, words

from sessionroute.emulate import HashTokenizer, render_chat

BS = 16


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _cached(usage: Any) -> int:
    details = usage.prompt_tokens_details
    assert details is not None
    return int(details.cached_tokens or 0)


async def test_chat_non_streaming_with_the_openai_sdk() -> None:
    async with running() as (h,):
        client = _client(h.url)
        msgs: list[Any] = [user("hello there")]
        r = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=7)
        prompt = HashTokenizer().encode(render_chat([("user", "hello there")]))
        assert r.choices[0].finish_reason == "length"
        text = r.choices[0].message.content
        assert text is not None
        assert len(HashTokenizer().encode(text)) == 7
        assert r.usage is not None
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), 7)
        assert r.usage.total_tokens == len(prompt) + 7
        assert _cached(r.usage) == 0
        assert r.model == MODEL and r.id.startswith("chatcmpl-")
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]


async def test_default_max_tokens_is_16_and_temperature_zero_is_deterministic() -> None:
    async with running() as (h,):
        client = _client(h.url)
        msgs: list[Any] = [user("same prompt")]
        a = await client.chat.completions.create(model=MODEL, messages=msgs, temperature=0)
        b = await client.chat.completions.create(model=MODEL, messages=msgs, temperature=0)
        c = await client.chat.completions.create(model=MODEL, messages=msgs)
        assert a.usage is not None and a.usage.completion_tokens == 16
        assert a.choices[0].message.content == b.choices[0].message.content
        assert c.choices[0].message.content != a.choices[0].message.content


async def test_chat_streaming_with_the_openai_sdk() -> None:
    async with running() as (h,):
        client = _client(h.url)
        msgs: list[Any] = [user("stream this")]
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        deltas: list[str] = []
        finish: list[str | None] = []
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                deltas.append(choice.delta.content or "")
                finish.append(choice.finish_reason)
        assert deltas[0] == ""  # the role chunk
        assert len([d for d in deltas if d]) == 12
        assert finish[-1] == "length" and finish.count("length") == 1
        assert usage is not None and usage.completion_tokens == 12
        plain = await client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=12, temperature=0
        )
        assert "".join(deltas) == plain.choices[0].message.content


async def test_completions_streaming_and_not() -> None:
    async with running() as (h,):
        client = _client(h.url)
        r = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=5)
        assert r.usage is not None and r.usage.prompt_tokens == 2
        assert len(HashTokenizer().encode(r.choices[0].text)) == 5
        ids = HashTokenizer().encode("Once upon")
        s = await client.completions.create(model=MODEL, prompt=ids, max_tokens=4, stream=True)
        texts = [c.choices[0].text async for c in s if c.choices]
        assert len(texts) == 4 and all(t.startswith(" ") for t in texts)


async def test_multi_turn_chat_hits_the_previous_turn_including_its_output() -> None:
    tok = HashTokenizer()
    async with running() as (h,):
        client = _client(h.url)
        msgs: list[Any] = [{"role": "system", "content": words(100, "sys")}, user("start")]
        cached: list[int] = []
        previous_end = 0
        for turn in range(4):
            r = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=21)
            assert r.usage is not None
            prompt_len = r.usage.prompt_tokens
            assert prompt_len == len(
                tok.encode(render_chat([(m["role"], m["content"]) for m in msgs]))
            )
            cached.append(_cached(r.usage))
            if turn:
                # Every full block of the previous prompt + output (its last token never
                # enters the KV cache) is hit.
                assert cached[-1] == (previous_end - 1) // BS * BS
            previous_end = prompt_len + 21
            msgs += [
                {"role": "assistant", "content": r.choices[0].message.content},
                user(words(30, f"obs{turn}")),
            ]
        assert cached[0] == 0 and cached == sorted(cached) and cached[-1] > cached[1]


async def test_cache_salt_separates_and_reset_prefix_cache_drops_hits() -> None:
    async with running() as (h,):
        client = _client(h.url)
        msgs: list[Any] = [user(words(80, "w"))]
        first = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
        again = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
        salted = await client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=2, extra_body={"cache_salt": "tenant-b"}
        )
        assert first.usage is not None and again.usage is not None and salted.usage is not None
        assert _cached(first.usage) == 0
        assert _cached(again.usage) == (first.usage.prompt_tokens - 1) // BS * BS > 0
        assert _cached(salted.usage) == 0
        hits = (await metrics(h.url))["vllm:prefix_cache_hits_total"]
        assert hits == _cached(again.usage)
        async with httpx.AsyncClient() as http:
            assert (await http.post(h.url + "/reset_prefix_cache")).status_code == 200
        after = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
        assert after.usage is not None and _cached(after.usage) == 0
        assert (await metrics(h.url))["vllm:prefix_cache_hits_total"] == hits


async def test_tokenize_matches_chat_prompt_tokens() -> None:
    async with running() as (h,):
        msgs = [user("count me")]
        async with httpx.AsyncClient(base_url=h.url) as http:
            tok = (await http.post("/tokenize", json={"model": MODEL, "messages": msgs})).json()
            text = (
                await http.post("/tokenize", json={"prompt": "a b", "return_token_strs": True})
            ).json()
            bad = await http.post("/tokenize", json={"model": MODEL})
            chat = await http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1})
        assert tok["count"] == len(tok["tokens"]) == chat.json()["usage"]["prompt_tokens"]
        assert tok["max_model_len"] == 32768
        assert text["token_strs"] == ["a", " b"] and text["count"] == 2
        assert bad.status_code == 400


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", {"model": MODEL, "max_tokens": 3}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [user("x")], "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/chat/completions", {"messages": [user("x")], "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/chat/completions", {"messages": [user("x")], "model": "nope"}, 404, "model"),
        ("/v1/chat/completions", {"messages": [user(words(300, "l"))]}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [user("x")], "max_tokens": 400}, 400, "max_tokens"),
        ("/v1/chat/completions", {"messages": [user("x")], "cache_salt": ""}, 400, "cache_salt"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [-3]}, 400, "prompt"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ],
)
async def test_bad_input_gets_vllm_statuses(
    path: str, body: dict[str, Any], status: int, param: str
) -> None:
    async with running(max_model_len=256) as (h,), httpx.AsyncClient() as http:
        resp = await http.post(h.url + path, json=body)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert err["code"] == status and err["param"] == param and err["message"]
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


async def test_malformed_json_and_unknown_route() -> None:
    async with running() as (h,), httpx.AsyncClient() as http:
        bad = await http.post(h.url + "/v1/chat/completions", content=b"{nope")
        msg = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        body = json.dumps(msg).encode()
        long_header = await http.post(  # a 60 KB header line: read, as vLLM reads it
            h.url + "/v1/chat/completions", content=body, headers={"x-big": "a" * 60_000}
        )
        gzip_claimed = await http.post(  # plain JSON that says it is gzip: a 400, not a 500
            h.url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        missing = await http.get(h.url + "/v1/nothing")
        method = await http.get(h.url + "/v1/chat/completions")
        version = await http.get(h.url + "/version")
    assert bad.status_code == 400 and "Malformed JSON" in bad.json()["error"]["message"]
    assert long_header.status_code == 200, long_header.text
    assert gzip_claimed.status_code == 400, gzip_claimed.text
    assert "Undecodable request body" in gzip_claimed.json()["error"]["message"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    assert method.status_code == 405 and method.json()["error"]["code"] == 405
    assert version.json()["version"].startswith("sessionroute-emulator")


async def test_openai_sdk_raises_on_bad_input() -> None:
    async with running(max_model_len=256) as (h,):
        client = _client(h.url)
        long: list[Any] = [user(words(300, "x"))]
        short: list[Any] = [user("x")]
        with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
            await client.chat.completions.create(model=MODEL, messages=long)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="other", messages=short)


async def test_metrics_have_vllms_names() -> None:
    async with running(kv_capacity_tokens=4096) as (h,):
        client = _client(h.url)
        msgs: list[Any] = [user("m")]
        await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5)
        m = await metrics(h.url)
        async with httpx.AsyncClient() as http:
            text = (await http.get(h.url + "/metrics")).text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:iteration_tokens_total_sum",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:cache_config_info",
    ):
        assert name in m, name
    assert m["vllm:generation_tokens_total"] == 5
    assert m["vllm:inter_token_latency_seconds_count"] == 4
    assert m["vllm:time_to_first_token_seconds_count"] == 1
    assert 'num_gpu_blocks="256"' in text and 'block_size="16"' in text


async def test_fidelity_load_reports_client_and_model_latencies() -> None:
    from sessionroute.emulate.fidelity import _load

    async with running(time_scale=100.0) as (h,):
        row = await _load(h.url, 100.0, 2, 8, 20, True)
    assert row["concurrency"] == 2 and row["stream"] is True
    # The client never sees a reply faster than the model says it takes.
    assert row["client_e2e_ms"] >= row["model_e2e_ms"] > 0
    assert row["client_ttft_ms"] is not None and row["model_ttft_ms"] > 0


async def test_fault_slowdown_route_is_off_by_default() -> None:
    async with running() as (h,), httpx.AsyncClient() as http:
        resp = await http.post(h.url + "/fault/slowdown", json={"factor": 10})
    assert resp.status_code == 404


async def _mean_itl(http: httpx.AsyncClient, url: str, prompt: str) -> float:
    """Mean inter-token latency (simulated seconds) of one 32-token answer to ``prompt``."""
    before = await metrics(url)
    body = {"messages": [user(prompt)], "max_tokens": 32}
    assert (await http.post(url + "/v1/chat/completions", json=body)).status_code == 200
    after = await metrics(url)
    total = "vllm:inter_token_latency_seconds_sum"
    count = "vllm:inter_token_latency_seconds_count"
    return (after[total] - before.get(total, 0.0)) / (after[count] - before.get(count, 0.0))


async def test_fault_slowdown_slows_every_step_at_run_time_and_back() -> None:
    async with running(fault_routes=True) as (h,), httpx.AsyncClient() as http:
        normal = await _mean_itl(http, h.url, words(40, "a"))
        slowed = await http.post(h.url + "/fault/slowdown", json={"factor": 10})
        assert slowed.json() == {"slowdown": 10.0}
        slow = await _mean_itl(http, h.url, words(40, "b"))
        assert (await http.post(h.url + "/fault/slowdown", json={"factor": 1})).status_code == 200
        again = await _mean_itl(http, h.url, words(40, "c"))
        bad = await http.post(h.url + "/fault/slowdown", json={"factor": 0})
        health = await http.get(h.url + "/health")
    assert slow == pytest.approx(10 * normal, rel=0.05)  # simulated seconds: exact model
    assert again == pytest.approx(normal, rel=0.05)
    assert bad.status_code == 400 and "factor" in bad.json()["error"]["message"]
    assert health.status_code == 200
