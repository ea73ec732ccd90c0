"""The llm backend: engine settings from config parameters, GPU placement, its metrics, and its chat prompts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.llm import LLMInstance, LLMModel
from naiad.backends.llm_request import RequestValues
from naiad.errors import InvalidArgument
from naiad.llm.loading.tokenizer import Tokenizer
from naiad.types import InferRequest


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
    from naiad.backends.llm import LLMMetrics, _Request
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


def test_chat_template_kwargs_reach_the_template_and_continuing_cuts_after_the_last_message() -> None:
    """The backend's chat prompt (LLMInstance._chat_prompt) on a template that reads an extra
    variable: chat_template_kwargs set it, and continue_final_message ends the prompt right
    after the last message's text, before the template closes it."""
    template = ("{% if thinking %}[think]{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}</>"
                "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    instance = SimpleNamespace(tokenizer=Tokenizer(HFTokenizer(WordLevel({"x": 0}, unk_token="x")), template))
    messages = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Paris is"}])

    def prompt(**parameters: object) -> str:
        values = RequestValues(InferRequest("m", None, [], parameters=dict(parameters)))
        return LLMInstance._chat_prompt(instance, messages, values)  # type: ignore[arg-type]

    assert prompt() == "<user>hi</><assistant>Paris is</><assistant>"
    assert prompt(chat_template_kwargs='{"thinking": true}').startswith("[think]<user>")
    assert prompt(add_generation_prompt=False, continue_final_message=True) == "<user>hi</><assistant>Paris is"
    with pytest.raises(InvalidArgument, match="may not set 'add_generation_prompt'"):
        prompt(chat_template_kwargs='{"add_generation_prompt": false}')
