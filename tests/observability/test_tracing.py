"""The tracer's sampling, settings and flags, without a server."""

from __future__ import annotations

import json

import pytest

from naiad.errors import InvalidArgument
from naiad.observability.tracing import Tracer, settings_from_flags


def _sampled(tracer: Tracer, model: str, requests: int) -> list[int]:
    return [i for i in range(requests) if tracer.start(model, 1, str(i)) is not None]


def test_off_by_default_then_one_in_rate_while_count_lasts() -> None:
    tracer = Tracer()
    assert _sampled(tracer, "m", 10) == []
    tracer.update(None, {"trace_level": ["TIMESTAMPS"], "trace_rate": "3", "trace_count": "2"})
    assert _sampled(tracer, "m", 10) == [0, 3]  # rate 3, then the count of 2 is spent
    assert _sampled(tracer, "other", 4) == [0, 3]  # each model samples on its own


def test_a_models_override_and_its_clearing() -> None:
    tracer = Tracer({"trace_level": ["TIMESTAMPS"], "trace_rate": "4"})
    tracer.update("m", {"trace_rate": "1"})
    assert _sampled(tracer, "m", 3) == [0, 1, 2]
    assert tracer.update("m", {"trace_rate": None})["trace_rate"] == "4"
    with pytest.raises(InvalidArgument, match="cannot be cleared globally"):
        tracer.update(None, {"trace_rate": None})


def test_traces_go_to_the_file_at_flush(tmp_path) -> None:
    path = tmp_path / "t.json"
    tracer = Tracer({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": str(path)})
    trace = tracer.start("m", 3, "abc")
    assert trace is not None
    trace.timestamps += [("REQUEST_END", 20), ("REQUEST_START", 10)]  # stamped out of order
    tracer.finish(trace)
    assert not path.exists()
    tracer.flush()
    info, stamps = json.loads(path.read_text())
    assert info == {"id": trace.id, "model_name": "m", "model_version": 3, "request_id": "abc", "parent_id": 0}
    assert [s["name"] for s in stamps["timestamps"]] == ["REQUEST_START", "REQUEST_END"]  # ordered by time


def test_flags_map_to_settings() -> None:
    settings, otel = settings_from_flags(["level=TIMESTAMPS", "rate=10", "triton,file=/tmp/x",
                                          "triton,log-frequency=5", "mode=triton"], count="7")
    assert otel is None
    assert settings == {"trace_level": ["TIMESTAMPS"], "trace_rate": "10", "trace_file": "/tmp/x",
                        "log_frequency": "5", "trace_count": "7"}
    assert settings_from_flags([], levels=["TIMESTAMPS", "TENSORS"])[0]["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    settings, otel = settings_from_flags(["mode=opentelemetry", "opentelemetry,url=http://h:4318/v1/traces",
                                          "opentelemetry,resource=service.name=naiad", "rate=0"])
    assert otel == {"url": "http://h:4318/v1/traces", "resource": "service.name=naiad"}
    assert settings == {"trace_rate": "0"}
    for bad in (["opentelemetry,colour=red"], ["mode=zipkin"], ["jaeger,url=x"]):
        with pytest.raises(ValueError):
            settings_from_flags(bad)


def test_opentelemetry_mode_traces_propagated_requests_and_refuses_updates() -> None:
    tracer = Tracer({"trace_level": ["TIMESTAMPS"], "trace_rate": "0"}, {"url": "http://127.0.0.1:9/v1/traces"})
    assert tracer.get(None)["trace_mode"] == "opentelemetry"
    assert tracer.start("m", 1, "a") is None  # rate 0: only what the client asks to trace
    context = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    trace = tracer.start("m", 1, "b", context)
    assert trace is not None and trace.context == context
    with pytest.raises(InvalidArgument, match="opentelemetry mode"):
        tracer.update(None, {"trace_rate": "1"})
    tracer.flush()


def test_without_a_trace_file_traces_are_not_kept() -> None:
    tracer = Tracer({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    for i in range(3):
        trace = tracer.start("m", 1, str(i))
        assert trace is not None
        tracer.finish(trace)
    assert tracer._buffer == []  # a long-running server would otherwise grow without end
