"""The llm backend: engine settings from config parameters, GPU placement, its metrics, and its chat prompts."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.llm import LLMModel
from naiad.errors import InvalidArgument


def _model(parameters: dict[str, str], tmp_path) -> LLMModel:
    config = mc.ModelConfig(name="m", backend="llm")
    for key, value in {"model": "weights", **parameters}.items():
        config.parameters[key].string_value = value
    return LLMModel(config, tmp_path, 1)


def test_engine_settings_come_from_config_parameters(tmp_path) -> None:
    config = _model({"dtype": "bf16", "kv_cache_fraction": "0.25", "max_num_seqs": "8", "enforce_eager": "true",
                     "enable_prefix_caching": "false", "tensor_parallel_size": "2"}, tmp_path).engine_config()
    assert config.model == tmp_path / "weights"  # relative to the version directory
    assert (config.dtype, config.kv_cache_fraction, config.max_num_seqs) == ("bf16", 0.25, 8)
    assert config.enforce_eager is True and config.enable_prefix_caching is False
    assert config.device == "cpu"
    assert config.tensor_parallel_size == 2


@pytest.mark.parametrize(("parameters", "message"), [
    ({"max_num_seqs": "many"}, "must be an integer"),
    ({"kv_cache_fraction": "half"}, "must be a number"),
    ({"enforce_eager": "maybe"}, "must be true or false"),
])
def test_bad_engine_settings_are_invalid_arguments(parameters: dict[str, str], message: str, tmp_path) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _model(parameters, tmp_path).engine_config()


def test_a_gpu_instance_runs_on_its_groups_gpu(tmp_path) -> None:
    model = _model({}, tmp_path)
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[2, 3])
    assert model.engine_config(group, 0).device == "cuda:2"
    assert model.engine_config(group, 1).device == "cuda:3"
    assert model.engine_config(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU), 0).device == "cpu"
    pinned = _model({"device": "cuda:1"}, tmp_path)
    assert pinned.engine_config(group, 0).device == "cuda:1"  # an explicit device wins


def test_llm_metrics_count_tokens_and_time_them() -> None:
    from naiad.backends.llm import _Request
    from naiad.backends.llm_metrics import LLMMetrics
    from naiad.llm.engine.engine_core import EngineStats

    metrics = LLMMetrics("llm_0")
    metrics.add_prompt(12)
    request = _Request(lambda *a: None, lambda: False, [1] * 12, 8, None, False, False, None)  # type: ignore[arg-type]
    request.arrival = 100.0
    metrics.tokens_out(request, 1, 100.375)  # first token after 0.375 s (times exact in binary)
    metrics.tokens_out(request, 1, 100.4375)  # the next 0.0625 s later
    metrics.tokens_out(request, 2, 100.5)
    rows = {row.name: row for row in metrics.rows()}
    assert rows["nv_llm_prompt_tokens"].value == 12 and rows["nv_llm_generation_tokens"].value == 4
    ttft = dict(rows["nv_llm_time_to_first_token_seconds"].buckets)
    assert ttft["0.25"] == 0 and ttft["0.5"] == 1 and ttft["+Inf"] == 1
    itl = dict(rows["nv_llm_inter_token_latency_seconds"].buckets)
    assert itl["+Inf"] == 2 and itl["0.05"] == 0 and itl["0.075"] == 2
    assert "nv_llm_kv_cache_usage" not in rows  # no engine step seen yet
    metrics.engine = EngineStats(num_used_blocks=25, num_blocks=100, num_preemptions=3, prefix_cache_queries=200,
                                 prefix_cache_hits=50)
    rows = {row.name: row for row in metrics.rows()}
    assert rows["nv_llm_kv_cache_usage"].value == 0.25
    assert rows["nv_llm_prefix_cache_hit_rate"].value == 0.25
    assert rows["nv_llm_preemptions"].value == 3 and rows["nv_llm_preemptions"].kind == "counter"
    assert all(row.labels == (("instance", "llm_0"),) for row in rows.values())



def test_placement_comes_from_the_backend_config_when_the_model_config_is_silent(tmp_path) -> None:
    # A KServe multi-node runtime passes these (--backend-config=llm,...); the model's config wins.
    config = mc.ModelConfig(name="m", backend="llm")
    config.parameters["model"].string_value = "weights"
    config.parameters["pipeline_parallel_size"].string_value = "1"
    backend_config = {"nnodes": "2", "master_addr": "llama-head.serving.svc.cluster.local",
                      "pipeline_parallel_size": "2", "dtype": "fp16"}  # dtype: not a placement setting
    LLMModel.auto_complete(config, tmp_path, {"backend_config": backend_config})
    engine = LLMModel(config, tmp_path, 1).engine_config()
    assert (engine.nnodes, engine.master_addr) == (2, "llama-head.serving.svc.cluster.local")
    assert (engine.pipeline_parallel_size, engine.tensor_parallel_size, engine.dtype) == (1, 1, "auto")
    assert "dtype" not in config.parameters
    LLMModel.auto_complete(config, tmp_path, {"backend_config": {"master_port": "twelve"}})
    with pytest.raises(InvalidArgument, match=r"master_port.*must be an integer"):
        LLMModel(config, tmp_path, 1).engine_config()
