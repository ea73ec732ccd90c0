"""Read the text in an image with the ``ocr`` model (PP-OCRv4 through BLS; works against naiad or Triton).

    make examples                                   # or: python examples/prepare.py
    naiad serve --model-repository examples/models
    python examples/client_ocr.py [--url localhost:8000] [--protocol http|grpc] [IMAGE_FILE]

Without an image file it draws two lines of text with Pillow and reads them back. IMAGE is sent as
UINT8 [height, width, 3] RGB; the answer holds one TEXT line per detected box, the box's four
corners (BOXES, pixels) and the recogniser's confidence (SCORES).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

DEMO_LINES = ["Hello from naiad", "PP-OCRv4 via BLS 2026"]


def demo_image() -> np.ndarray:
    """A white image with :data:`DEMO_LINES` in Pillow's bundled font (Pillow >= 10.1)."""
    image = Image.new("RGB", (720, 200), "white")
    pen = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=36)
    for row, line in enumerate(DEMO_LINES):
        pen.text((24, 30 + 80 * row), line, fill="black", font=font)
    return np.asarray(image)


def load(path: Path | None) -> np.ndarray:
    """The image at ``path`` as RGB uint8, or the demo image."""
    if path is None:
        return demo_image()
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def read_text(protocol: str, url: str, image: np.ndarray) -> list[tuple[str, list[list[int]], float]]:
    """(line, corners, score) for every line the server finds in ``image``, in reading order."""
    module: Any
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    client = module.InferenceServerClient(url=url)
    tensor = module.InferInput("IMAGE", list(image.shape), "UINT8")
    tensor.set_data_from_numpy(np.ascontiguousarray(image))
    result = client.infer("ocr", [tensor])
    lines = [t.decode("utf-8") for t in result.as_numpy("TEXT").tolist()]
    return list(zip(lines, result.as_numpy("BOXES").tolist(), result.as_numpy("SCORES").tolist(), strict=True))


def main() -> None:
    """Print each line read from the image with its box and confidence."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", nargs="?", type=Path, help="an image file (default: a drawn demo image)")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--url", help="server address (default: localhost:8000 for http, localhost:8001 for grpc)")
    args = parser.parse_args()
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    found = read_text(args.protocol, url, load(args.image))
    if not found:
        print("no text found")
    for line, box, score in found:
        print(f"{score:.3f}  {line!r}  at {box}")


if __name__ == "__main__":
    main()
