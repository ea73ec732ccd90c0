"""The label table and the weighted chooser (naiad.core.labels)."""

from __future__ import annotations

import collections
import json

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.labels import VersionLabels, label_change, same_but_labels, without_labels
from naiad.errors import InvalidArgument

SPLIT_IDS = [f"request-{i}" for i in range(2000)]


def test_parse_resolves_labels_to_versions() -> None:
    labels = VersionLabels.parse("m", "stable=3, canary = 4", "")
    assert labels.resolve("stable") == 3
    assert labels.resolve("canary") == 4
    assert labels.labels_text() == "stable=3,canary=4"
    assert labels.choose("any") is None  # no split: requests keep the version policy


def test_colon_separated_pairs_are_accepted() -> None:
    labels = VersionLabels.parse("m", "stable: 3, canary: 4", "stable: 90, canary: 10")
    assert labels.split == (("stable", 90), ("canary", 10))


def test_unknown_label_is_a_clear_error() -> None:
    labels = VersionLabels.parse("m", "stable=3")
    with pytest.raises(InvalidArgument, match=r"^label 'beta' is not defined for model 'm'$"):
        labels.resolve("beta")


@pytest.mark.parametrize(("labels", "split", "message"), [
    ("stable", "", r"'stable' is not a label=value pair \(expected e.g. 'stable=3,canary=4'\)"),
    ("stable=x", "", r"'x' \(label 'stable'\) is not a non-negative integer"),
    ("stable=-1", "", r"'-1' \(label 'stable'\) is not a non-negative integer"),
    ("3=3", "", r"label '3' must start with a letter"),
    ("stable=3,stable=4", "", r"label 'stable' appears twice"),
    ("stable=3", "canary=10", r"invalid version_split for model 'm': label 'canary' is not defined in version_labels"),
    ("stable=3", "stable=0", r"the weights sum to 0"),
    ("stable=3", "stable=ten", r"'ten' \(label 'stable'\) is not a non-negative integer"),
])
def test_malformed_texts_are_rejected(labels: str, split: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        VersionLabels.parse("m", labels, split)


def test_choose_is_deterministic_per_request_id() -> None:
    labels = VersionLabels.parse("m", "stable=1,canary=2", "stable=50,canary=50")
    first = [labels.choose(i) for i in SPLIT_IDS]
    # A rebuilt table (another process, a relabel with the same split) chooses alike: the hash is
    # stable, not Python's salted hash().
    again = VersionLabels.parse("m", "stable=1,canary=2", "stable=50,canary=50")
    assert [again.choose(i) for i in SPLIT_IDS] == first
    assert set(first) == {"stable", "canary"}


def test_choice_depends_on_the_model_too() -> None:
    a = VersionLabels.parse("a", "stable=1,canary=2", "stable=50,canary=50")
    b = VersionLabels.parse("b", "stable=1,canary=2", "stable=50,canary=50")
    assert [a.choose(i) for i in SPLIT_IDS] != [b.choose(i) for i in SPLIT_IDS]


@pytest.mark.parametrize("with_ids", [True, False])
def test_split_share_over_2000_requests_is_within_3_points(with_ids: bool) -> None:
    labels = VersionLabels.parse("m", "stable=1,canary=2", "stable=90,canary=10")
    counts = collections.Counter(labels.choose(i if with_ids else "") for i in SPLIT_IDS)
    assert abs(counts["canary"] / len(SPLIT_IDS) - 0.10) <= 0.03
    assert counts["stable"] + counts["canary"] == len(SPLIT_IDS)


def test_zero_weight_label_is_never_chosen() -> None:
    labels = VersionLabels.parse("m", "stable=1,canary=2", "stable=100,canary=0")
    assert {labels.choose(i) for i in SPLIT_IDS} == {"stable"}


def test_changed_replaces_only_what_is_given() -> None:
    labels = VersionLabels.parse("m", "stable=1,canary=2", "stable=90,canary=10")
    promoted = labels.changed("stable=2,canary=2", None)
    assert promoted.resolve("stable") == 2
    assert promoted.split == labels.split  # the split stays
    assert labels.resolve("stable") == 1  # the old table is untouched: in-flight requests keep it
    assert promoted.changed(None, "").split == ()  # "" removes the split
    with pytest.raises(InvalidArgument, match="label 'canary' is not defined"):
        labels.changed("stable=1", None)  # the kept split would name a removed label


def test_from_config_reads_parameters() -> None:
    config = mc.ModelConfig(name="m")
    assert VersionLabels.from_config("m", config) is None
    assert "version_labels" not in config.parameters  # reading did not insert the key
    config.parameters["version_labels"].string_value = "stable=1,canary=2"
    config.parameters["version_split"].string_value = "stable=3,canary=1"
    labels = VersionLabels.from_config("m", config)
    assert labels is not None
    assert labels.as_dict() == {"name": "m", "labels": {"stable": 1, "canary": 2},
                                "split": {"stable": 3, "canary": 1}}


def test_apply_to_writes_the_labels_in_force() -> None:
    config = mc.ModelConfig(name="m")
    config.parameters["version_split"].string_value = "old=1"
    VersionLabels.parse("m", "stable=2").apply_to(config)
    assert config.parameters["version_labels"].string_value == "stable=2"
    assert "version_split" not in config.parameters


def test_configs_differing_only_in_labels_are_the_same_serving_config() -> None:
    a = mc.ModelConfig(name="m", max_batch_size=4)
    b = mc.ModelConfig(name="m", max_batch_size=4)
    b.parameters["version_labels"].string_value = "stable=1"
    assert same_but_labels(a, b)
    assert "version_labels" in b.parameters and "version_labels" not in without_labels(b).parameters
    b.max_batch_size = 8
    assert not same_but_labels(a, b)


def test_label_only_config_is_a_label_change() -> None:
    change = {"parameters": {"version_labels": {"string_value": "stable=2"}, "version_split": {"string_value": ""}}}
    assert label_change(json.dumps(change)) == {"version_labels": "stable=2", "version_split": ""}
    assert label_change(json.dumps({"name": "m", **change})) is not None
    # Anything else in the config makes it a real config override.
    assert label_change(json.dumps({"max_batch_size": 4, **change})) is None
    assert label_change(json.dumps({"parameters": {"other": {"string_value": "x"}}})) is None
    assert label_change("not json") is None
    with pytest.raises(InvalidArgument, match="must have a string_value"):
        label_change(json.dumps({"parameters": {"version_labels": {"int_value": 3}}}))
