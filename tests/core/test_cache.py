"""The response cache: LRU order within a byte budget, keys, copies, threads, and how a loaded
version answers hits and stores misses."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.cache import (
    ENTRY_OVERHEAD_BYTES,
    CachedResponse,
    ModelCache,
    ResponseCache,
    request_key,
    serves,
)
from naiad.core.responses import ResponseBuilder
from naiad.errors import InternalError
from naiad.observability.statistics import LatencySettings, ModelStatistics
from naiad.scheduling.base import Job
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor, TensorSpec


def _entry(nbytes: int) -> CachedResponse:
    """An entry of exactly `nbytes` bytes (with the per-entry overhead)."""
    data = np.zeros(nbytes - ENTRY_OVERHEAD_BYTES, dtype=np.uint8)
    return CachedResponse.of(InferResponse("m", "1", outputs=[Tensor("OUT", DataType.UINT8, data.shape, data)]))


def _request(data: np.ndarray | None = None, **kwargs: object) -> InferRequest:
    data = np.arange(4, dtype=np.float32).reshape(1, 4) if data is None else data
    return InferRequest("m", 1, [Tensor("INPUT0", DataType.from_numpy(data.dtype), data.shape, data)], **kwargs)


def _key(request: InferRequest, model: str = "m", version: str = "1", token: int = 0) -> bytes:
    return request_key(request, model, version, token)


# -- the store -----------------------------------------------------------------------------------

def test_the_least_recently_used_entry_goes_first() -> None:
    cache = ResponseCache(3 * 100)
    for key in (b"a", b"b", b"c"):
        assert cache.insert(key, _entry(100))
    assert cache.lookup(b"a") is not None  # a is now the most recently used: b is the oldest
    assert cache.insert(b"d", _entry(100))
    assert b"b" not in cache
    assert [key in cache for key in (b"a", b"c", b"d")] == [True, True, True]
    assert cache.counters.evicted == 1


def test_the_byte_budget_evicts_as_many_as_needed() -> None:
    cache = ResponseCache(1000)
    for index in range(5):
        cache.insert(bytes([index]), _entry(200))
    assert cache.size == 1000 and len(cache) == 5
    assert cache.insert(b"big", _entry(700))  # needs the room of four old entries
    assert cache.size == 200 + 700 and len(cache) == 2
    assert bytes([4]) in cache and b"big" in cache  # the newest old entry stays
    assert cache.counters.evicted == 4


def test_an_entry_larger_than_the_budget_is_not_stored_and_evicts_nothing() -> None:
    cache = ResponseCache(500)
    cache.insert(b"small", _entry(100))
    assert not cache.insert(b"huge", _entry(501))
    assert b"huge" not in cache and b"small" in cache
    assert cache.size == 100 and cache.counters.too_large == 1
    assert cache.insert(b"exact", _entry(400))  # exactly the remaining room fits
    assert cache.size == 500


def test_replacing_an_entry_counts_its_bytes_once() -> None:
    cache = ResponseCache(1000)
    cache.insert(b"k", _entry(300))
    cache.insert(b"k", _entry(500))
    assert cache.size == 500 and len(cache) == 1


def test_a_missing_key_is_none() -> None:
    assert ResponseCache(100).lookup(b"nothing") is None


@pytest.mark.parametrize("size", [0, -1])
def test_the_cache_needs_a_positive_size(size: int) -> None:
    with pytest.raises(ValueError, match="positive size"):
        ResponseCache(size)


def test_bytes_outputs_count_their_elements() -> None:
    data = np.array([b"x" * 1000, b"y" * 24], dtype=object)
    entry = CachedResponse.of(InferResponse("m", "1", outputs=[Tensor("T", DataType.BYTES, (2,), data)]))
    assert entry.nbytes == ENTRY_OVERHEAD_BYTES + data.nbytes + 1024


def test_entries_are_read_only_copies() -> None:
    data = np.ones((1, 4), dtype=np.float32)
    response = InferResponse("m", "1", outputs=[Tensor("OUT", DataType.FP32, (1, 4), data)],
                             parameters={"p": 1})
    entry = CachedResponse.of(response)
    data[0, 0] = 42  # the backend reuses its buffer...
    response.parameters["p"] = 2
    assert entry.outputs["OUT"].data[0, 0] == 1  # ...the entry does not change
    assert entry.parameters == {"p": 1}
    with pytest.raises(ValueError, match="read-only"):
        entry.outputs["OUT"].data[0, 0] = 7


def test_threads_keep_the_size_consistent() -> None:
    cache = ResponseCache(50 * 128)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for index in range(300):
                key = bytes([(seed * 7 + index) % 97])
                if cache.lookup(key) is None:
                    cache.insert(key, _entry(128 + (index % 3) * 64))
        except BaseException as error:  # reported below: a thread cannot fail the test itself
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert cache.size <= cache.capacity
    assert cache.size == sum(entry.nbytes for entry in cache._entries.values())


# -- keys ----------------------------------------------------------------------------------------

def test_equal_requests_have_equal_keys() -> None:
    assert _key(_request()) == _key(_request())


def test_any_input_byte_changes_the_key() -> None:
    base = _request()
    for index in range(4):
        changed = np.arange(4, dtype=np.float32).reshape(1, 4)
        changed.view(np.uint8).reshape(-1)[index * 4] ^= 1  # one bit of one element
        assert _key(_request(changed)) != _key(base)


def test_shape_datatype_and_name_change_the_key() -> None:
    base = _request()
    reshaped = _request(np.arange(4, dtype=np.float32).reshape(2, 2))  # same bytes, other shape
    retyped = _request(np.arange(4, dtype=np.float32).view(np.int32).reshape(1, 4))  # same bytes, INT32
    renamed = _request()
    renamed.inputs[0].name = "INPUT1"
    keys = {_key(base), _key(reshaped), _key(retyped), _key(renamed)}
    assert len(keys) == 4


def test_model_version_and_load_token_change_the_key() -> None:
    request = _request()
    keys = {_key(request), _key(request, model="other"), _key(request, version="2"), _key(request, token=7)}
    assert len(keys) == 4


def test_the_order_of_inputs_does_not_matter() -> None:
    a = Tensor("A", DataType.INT32, (1,), np.array([1], dtype=np.int32))
    b = Tensor("B", DataType.INT32, (1,), np.array([2], dtype=np.int32))
    assert _key(InferRequest("m", 1, [a, b])) == _key(InferRequest("m", 1, [b, a]))


def test_bytes_inputs_are_keyed_by_their_elements() -> None:
    def request(*items: bytes) -> InferRequest:
        data = np.array(items, dtype=object)
        return InferRequest("m", 1, [Tensor("T", DataType.BYTES, data.shape, data)])

    assert _key(request(b"ab", b"c")) == _key(request(b"ab", b"c"))
    assert _key(request(b"ab", b"c")) != _key(request(b"a", b"bc"))  # element boundaries count
    assert _key(request(b"ab", b"c")) != _key(request(b"ab", b"d"))


def test_parameters_that_can_change_the_result_change_the_key() -> None:
    base = _key(_request())
    assert _key(_request(parameters={"temperature": 0.5})) != base
    assert _key(_request(parameters={"temperature": 0.5})) != _key(_request(parameters={"temperature": 0.6}))
    assert _key(_request(parameters={"flag": 1})) != _key(_request(parameters={"flag": "1"}))  # type counts


def test_scheduling_and_wire_parameters_do_not_change_the_key() -> None:
    neutral = {"priority": 1, "timeout": 100, "binary_data_output": True}
    assert _key(_request(parameters=neutral)) == _key(_request())
    assert _key(_request(id="one")) == _key(_request(id="two"))
    binary = [RequestedOutput("OUTPUT0", {"binary_data": True})]
    assert _key(_request(outputs=binary)) == _key(_request())


def test_classification_changes_the_key() -> None:
    classified = [RequestedOutput("OUTPUT0", {"classification": 2})]
    other = [RequestedOutput("OUTPUT0", {"classification": 3})]
    assert len({_key(_request()), _key(_request(outputs=classified)), _key(_request(outputs=other))}) == 3


# -- a loaded version's cache --------------------------------------------------------------------

OUTPUTS = [TensorSpec("OUTPUT0", DataType.FP32, (-1, 4)), TensorSpec("OUTPUT1", DataType.FP32, (-1, 4))]


def _model_cache(store: ResponseCache | None = None, summaries: bool = False) -> ModelCache:
    stats = ModelStatistics("m", "1", latency=LatencySettings(summaries=summaries), cache_enabled=True)
    builder = ResponseBuilder("m", "1", OUTPUTS, batched=True, labels={})
    return ModelCache(store or ResponseCache(1 << 20), stats, builder)


def _job(request: InferRequest, answers: list[InferResponse]) -> Job:
    return Job(request, answers.append)


def _outputs(request: InferRequest) -> list[Tensor]:
    data = request.inputs[0].data
    return [Tensor("OUTPUT0", DataType.FP32, data.shape, data), Tensor("OUTPUT1", DataType.FP32, data.shape, data * 2)]


def _run(job: Job) -> None:
    """What the runner does for a queued job: answer it through its (wrapped) sink."""
    job.sink(InferResponse("m", "1", job.request.id, _outputs(job.request)))


def test_a_miss_is_queued_and_its_response_stored_then_a_hit_answers_at_once() -> None:
    cache, answers, released = _model_cache(), [], []
    first = _job(_request(id="first"), answers)
    assert not cache.answer(first, lambda: released.append(1))
    assert not answers and not released  # nothing answered yet: it goes to the scheduler
    _run(first)
    assert answers[0].id == "first" and len(cache.store) == 1
    second = _job(_request(id="second"), answers)
    assert cache.answer(second, lambda: released.append(1))
    hit = answers[1]
    assert released == [1]  # the hit gives its in-flight slot back itself
    assert hit.id == "second" and [t.name for t in hit.outputs] == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(hit.outputs[1].data, answers[0].outputs[1].data)
    assert cache.answer(_job(_request(id="third"), answers), lambda: None)
    assert answers[2].outputs[0] is not hit.outputs[0]  # each hit gets its own Tensor (frontends add to it)
    stats = cache.stats.as_dict()
    infer = stats["inference_stats"]
    assert infer["cache_hit"]["count"] == 2 and infer["cache_miss"]["count"] == 1
    assert infer["success"]["count"] == 2 and infer["queue"]["count"] == 2  # the hits' (no runner here)
    assert stats["inference_count"] == 0 and stats["execution_count"] == 0
    assert infer["compute_infer"]["count"] == 0


def test_a_hit_answers_only_the_outputs_asked_for() -> None:
    cache, answers = _model_cache(), []
    miss = _job(_request(), answers)
    cache.answer(miss, lambda: None)
    _run(miss)
    assert cache.answer(_job(_request(outputs=[RequestedOutput("OUTPUT1")]), answers), lambda: None)
    assert [t.name for t in answers[-1].outputs] == ["OUTPUT1"]


def test_an_entry_without_an_asked_output_is_a_miss_and_is_replaced() -> None:
    cache, answers = _model_cache(), []
    narrow = _job(_request(outputs=[RequestedOutput("OUTPUT0")]), answers)
    cache.answer(narrow, lambda: None)
    narrow.sink(InferResponse("m", "1", "", _outputs(narrow.request)[:1]))  # the backend made only OUTPUT0
    wide = _job(_request(), answers)
    assert not cache.answer(wide, lambda: None)  # OUTPUT1 is not in the entry
    _run(wide)
    assert cache.answer(_job(_request(), answers), lambda: None)
    assert len(cache.store) == 1


def test_failed_responses_are_not_stored() -> None:
    cache, answers = _model_cache(), []
    job = _job(_request(), answers)
    cache.answer(job, lambda: None)
    job.sink(InferResponse("m", "1", error=InternalError("boom")))
    assert len(cache.store) == 0 and answers[0].error is not None
    assert cache.stats.as_dict()["inference_stats"]["cache_miss"]["count"] == 0  # as Triton: successes only
    assert not cache.answer(_job(_request(), answers), lambda: None)


def test_a_new_load_does_not_see_the_old_loads_entries() -> None:
    store, answers = ResponseCache(1 << 20), []
    old = _model_cache(store)
    job = _job(_request(), answers)
    old.answer(job, lambda: None)
    _run(job)
    assert not _model_cache(store).answer(_job(_request(), answers), lambda: None)


def test_cache_summaries_replace_the_request_summary() -> None:
    cache, answers = _model_cache(summaries=True), []
    job = _job(_request(), answers)
    cache.answer(job, lambda: None)
    cache.stats.record_request(True, 1_000, 100, (1, 2, 3))
    _run(job)
    cache.answer(_job(_request(), answers), lambda: None)
    rows = {key: count for key, _, count, _ in cache.stats.summary_rows(0)}
    assert rows == {"queue": 2, "compute_input": 1, "compute_infer": 1, "compute_output": 1,
                    "cache_hit": 1, "cache_miss": 1}


def test_which_configs_the_cache_serves() -> None:
    config = mc.ModelConfig(name="m", backend="identity")
    assert not serves(config)
    config.response_cache.enable = True
    assert serves(config)
    ensemble = mc.ModelConfig(name="e", platform="ensemble")
    ensemble.response_cache.enable = True
    assert not serves(ensemble)  # Triton caches an ensemble's composing models, not the ensemble
