"""The OCR pipeline of the example repository (the `ocr` BLS model driving ocr_det, ocr_cls and
ocr_rec, PP-OCRv4 from the rapidocr-onnxruntime wheel), served by a real naiad through tritonclient
over HTTP and gRPC, on images with text drawn by Pillow in its bundled TrueType font.

Matching rule: a line read back counts when it equals the drawn line up to case with a Levenshtein
distance of at most 1 (near-exact; in practice the lines come back exactly). Boxes must cover the
drawn text (intersection over union with Pillow's own text box above 0.5).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ServerProcess
from PIL import Image, ImageDraw, ImageFont
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

OCR_DIR = Path(__file__).resolve().parents[2] / "examples" / "models" / "ocr" / "1"
CLIENTS = {"http": httpclient, "grpc": grpcclient}
PROTOCOLS = ["http", "grpc"]
LINES = ["Hello naiad 2026", "Quick brown fox jumps"]
FONT_SIZE = 36
MAX_EDITS = 1


def client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def image_tensor(protocol: str, image: np.ndarray, datatype: str = "UINT8", name: str = "IMAGE") -> Any:
    made = CLIENTS[protocol].InferInput(name, list(image.shape), datatype)
    made.set_data_from_numpy(image)
    return made


def draw(lines: list[str], size: tuple[int, int] = (640, 200)) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """A white RGB image with ``lines`` in black, one under the other, and each line's pixel box."""
    # Pillow >= 10.1 bundles a scalable TrueType font, so no system font is needed.
    font = ImageFont.load_default(size=FONT_SIZE)
    image = Image.new("RGB", size, "white")
    pen = ImageDraw.Draw(image)
    boxes = []
    for row, line in enumerate(lines):
        at = (24, 30 + row * 80)
        pen.text(at, line, fill="black", font=font)
        boxes.append(pen.textbbox(at, line, font=font))
    return np.asarray(image), boxes


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def assert_reads(got: list[str], expected: list[str]) -> None:
    assert len(got) == len(expected), got
    for line, want in zip(got, expected, strict=True):
        assert edit_distance(line.lower(), want.lower()) <= MAX_EDITS, (got, expected)


def iou(quad: np.ndarray, box: tuple[int, ...]) -> float:
    """Intersection over union of a detected quad's bounding rectangle and an (x0, y0, x1, y1) box."""
    qx0, qy0 = quad.min(axis=0)
    qx1, qy1 = quad.max(axis=0)
    bx0, by0, bx1, by1 = box
    inter = max(0, min(qx1, bx1) - max(qx0, bx0)) * max(0, min(qy1, by1) - max(qy0, by0))
    union = (qx1 - qx0) * (qy1 - qy0) + (bx1 - bx0) * (by1 - by0) - inter
    return float(inter / union)


def read(server: ServerProcess, protocol: str, image: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    result = client(server, protocol).infer("ocr", [image_tensor(protocol, image)])
    text = [t.decode("utf-8") for t in result.as_numpy("TEXT").tolist()]
    return text, result.as_numpy("BOXES"), result.as_numpy("SCORES")


# --------------------------------------------------------------------------- reading text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reads_the_drawn_lines_back_in_order_with_their_boxes(example_server: ServerProcess, protocol: str) -> None:
    image, drawn = draw(LINES)
    text, boxes, scores = read(example_server, protocol, image)
    assert_reads(text, LINES)
    assert boxes.shape == (2, 4, 2) and boxes.dtype == np.int32
    assert scores.shape == (2,) and scores.min() > 0.9
    for quad, box in zip(boxes, drawn, strict=True):
        assert iou(quad, box) > 0.5, (quad.tolist(), box)


def test_reads_an_upside_down_image_after_the_direction_classifier_turns_it(example_server: ServerProcess) -> None:
    image, _ = draw(LINES)
    text, boxes, _ = read(example_server, "grpc", np.ascontiguousarray(image[::-1, ::-1]))
    assert_reads(text, LINES[::-1])  # the second line is now on top
    assert boxes[0, 0, 1] < boxes[1, 0, 1]


def test_reads_slanted_lines_through_rotated_boxes_and_perspective_crops(example_server: ServerProcess) -> None:
    image, _ = draw(LINES)
    slanted = np.asarray(Image.fromarray(image).rotate(8, expand=True, fillcolor="white"))
    text, boxes, _ = read(example_server, "http", slanted)
    assert_reads(sorted(text), sorted(LINES))
    edges = boxes[:, 1] - boxes[:, 0]  # tl -> tr: the top edge follows the text's slant (up to the right)
    assert np.all(edges[:, 1] < -0.05 * edges[:, 0]), boxes.tolist()


def test_reads_a_single_word_on_a_small_image(example_server: ServerProcess) -> None:
    image, _ = draw(["Triton"], size=(200, 100))
    text, _, _ = read(example_server, "http", image)
    assert_reads(text, ["Triton"])


def test_blank_image_has_no_lines(example_server: ServerProcess) -> None:
    text, boxes, scores = read(example_server, "http", np.full((120, 300, 3), 255, np.uint8))
    assert text == [] and boxes.shape == (0, 4, 2) and scores.shape == (0,)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_image_without_three_channels_is_refused(example_server: ServerProcess, protocol: str) -> None:
    image = np.zeros((32, 32, 4), np.uint8)
    expected = "unexpected shape for input 'IMAGE' for model 'ocr'. Expected [-1,-1,3], got [32,32,4]"
    with pytest.raises(InferenceServerException, match=re.escape(expected)):
        client(example_server, protocol).infer("ocr", [image_tensor(protocol, image)])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_image_of_the_wrong_datatype_is_refused(example_server: ServerProcess, protocol: str) -> None:
    image = np.zeros((32, 32, 3), np.float32)
    expected = "inference input 'IMAGE' data-type is 'FP32', but model 'ocr' expects 'UINT8'"
    with pytest.raises(InferenceServerException, match=re.escape(expected)):
        client(example_server, protocol).infer("ocr", [image_tensor(protocol, image, "FP32")])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_empty_image_is_refused(example_server: ServerProcess, protocol: str) -> None:
    with pytest.raises(InferenceServerException, match=r"IMAGE must be at least 1x1 pixels, got shape \[0, 16, 3\]"):
        client(example_server, protocol).infer("ocr", [image_tensor(protocol, np.zeros((0, 16, 3), np.uint8))])


# --------------------------------------------------------------------------- the numpy geometry, in process


@pytest.fixture(scope="module")
def geometry() -> Any:
    sys.path.insert(0, str(OCR_DIR))
    try:
        import ocr_boxes
        import ocr_image
    finally:
        sys.path.remove(str(OCR_DIR))
    return ocr_boxes, ocr_image


def test_components_are_8_connected(geometry: Any) -> None:
    ocr_boxes, _ = geometry
    mask = np.zeros((6, 8), bool)
    mask[0, 0] = mask[1, 1] = True  # touching diagonally: one region
    mask[4:6, 4:8] = True  # a separate block
    regions = ocr_boxes.components(mask)
    assert sorted(len(r) for r in regions) == [4, 4]  # two end points per pixel run


def test_min_area_rect_of_a_rotated_rectangle(geometry: Any) -> None:
    ocr_boxes, _ = geometry
    angle = np.deg2rad(20)
    axes = np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
    grid = np.stack(np.meshgrid(np.linspace(-30, 30, 61), np.linspace(-5, 5, 11)), -1).reshape(-1, 2)
    centre, size, _ = ocr_boxes.min_area_rect(grid @ axes + [100, 50])
    np.testing.assert_allclose(centre, [100, 50], atol=1e-6)
    np.testing.assert_allclose(sorted(size), [10, 60], atol=1e-6)


def test_reading_order_is_rows_then_left_to_right(geometry: Any) -> None:
    ocr_boxes, _ = geometry

    def box(x: int, y: int) -> np.ndarray:
        return np.array([[x, y], [x + 10, y], [x + 10, y + 5], [x, y + 5]])

    boxes = [box(50, 12), box(0, 40), box(5, 10)]  # the first two tops are within 10 px: one row
    assert ocr_boxes.reading_order(boxes) == [2, 0, 1]


def test_crop_quad_straightens_a_rectangle(geometry: Any) -> None:
    _, ocr_image = geometry
    image = np.zeros((40, 60, 3), np.uint8)
    image[10:20, 5:45] = 200
    crop = ocr_image.crop_quad(image, np.array([[5, 10], [45, 10], [45, 20], [5, 20]], np.float32))
    assert crop.shape == (10, 40, 3)
    assert crop[1:-1, 1:-1].min() == 200
