"""Small parts of the emulator: SSE chunk encoding and latency histograms."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sessionroute.emulate.metrics import LatencyHistogram
from sessionroute.emulate.sse import ChunkEncoder


def _event(raw: bytes) -> Any:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return json.loads(raw[6:])


def test_chat_chunks_have_vllms_shape() -> None:
    enc = ChunkEncoder("chatcmpl-1", 'm"odel', 7, chat=True, prompt_len=5, continuous=False)
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": 'm"odel'}
    assert _event(enc.role()) == {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    choice = {"index": 0, "delta": {"content": ' a"b'}, "logprobs": None, "finish_reason": None}
    assert _event(enc.token(' a"b', 0, False)) == {**head, "choices": [choice]}
    last = _event(enc.token(" c", 1, True))
    assert last["choices"][0]["finish_reason"] == "length"
    assert _event(enc.usage({"prompt_tokens": 5})) == {
        **head,
        "choices": [],
        "usage": {"prompt_tokens": 5},
    }


def test_completion_chunks_with_continuous_usage() -> None:
    enc = ChunkEncoder("cmpl-2", "m", 1, chat=False, prompt_len=5, continuous=True)
    ev = _event(enc.token(" x", 2, False))
    assert ev["object"] == "text_completion"
    assert ev["choices"] == [
        {"index": 0, "text": " x", "stop_reason": None, "logprobs": None, "finish_reason": None}
    ]
    assert ev["usage"] == {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}


class _One(Collector):
    def __init__(self, h: LatencyHistogram) -> None:
        self.h = h

    def collect(self) -> Any:
        yield self.h.family(["model_name"], ["m"])


def test_latency_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    h = LatencyHistogram("vllm:x_seconds", "x", (0.1, 1.0))
    h.observe(0.1)  # on the bound: in le=0.1
    h.observe(0.5, 3)
    h.observe(5.0)
    h.observe(2.0, 0)  # nothing
    reg = CollectorRegistry()
    reg.register(_One(h))
    samples = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(generate_latest(reg).decode())
        for s in f.samples
    }
    assert samples[("vllm:x_seconds_bucket", "0.1")] == 1
    assert samples[("vllm:x_seconds_bucket", "1.0")] == 4
    assert samples[("vllm:x_seconds_bucket", "+Inf")] == 5
    assert samples[("vllm:x_seconds_count", None)] == 5
    assert samples[("vllm:x_seconds_sum", None)] == 0.1 + 1.5 + 5.0
