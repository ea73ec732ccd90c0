"""Splitting a thinking model's answer into reasoning_content and content, whole or in pieces."""

from __future__ import annotations

import pytest

from naiad.errors import InternalError
from naiad.frontends.http.reasoning import ReasoningSplitter, thinks_first

ANSWER = "<think>The capital. Paris.</think>\n\nParis is the capital."


def _pieces(thinking: bool, pieces: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter(thinking)
    reasoning, content = "", ""
    for index, piece in enumerate(pieces):
        r, c = splitter.push(piece, final=index == len(pieces) - 1)
        reasoning, content = reasoning + r, content + c
    return reasoning, content


def test_qwen3_answers_split_at_their_tags_and_untagged_ones_are_content() -> None:
    assert _pieces(thinks_first("qwen3"), [ANSWER]) == ("The capital. Paris.", "\n\nParis is the capital.")
    assert _pieces(thinks_first("qwen3"), ["Just Paris."]) == ("", "Just Paris.")


def test_deepseek_r1_answers_are_reasoning_until_the_closing_tag() -> None:
    assert _pieces(thinks_first("deepseek_r1"), ["Hmm, France.</think>Paris."]) == ("Hmm, France.", "Paris.")
    assert _pieces(thinks_first("deepseek_r1"), ["still thinking"]) == ("still thinking", "")


def test_tags_split_across_pieces_are_found_and_never_shown() -> None:
    one_by_one = list(ANSWER)
    assert _pieces(False, one_by_one) == ("The capital. Paris.", "\n\nParis is the capital.")
    splitter = ReasoningSplitter(False)
    assert splitter.push("a <thi") == ("", "a ")  # could be a tag: held back
    assert splitter.push("s is no tag") == ("", "<this is no tag")


def test_a_held_back_tag_start_goes_out_at_the_end() -> None:
    assert _pieces(False, ["ends with <", "/thi"]) == ("", "ends with </thi")


def test_an_unknown_parser_is_a_config_mistake() -> None:
    with pytest.raises(InternalError, match="unknown reasoning_parser 'granite'"):
        thinks_first("granite")
