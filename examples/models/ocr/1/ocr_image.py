"""Image operations of the OCR pipeline in numpy: bilinear resizing, perspective crops, and the
three models' input normalisation (PP-OCR's constants: pixels scaled to [-1, 1], channels first)."""

import math

import numpy as np

DET_LIMIT_SIDE = 960  # PaddleOCR's det_limit_side_len with det_limit_type "max"
DET_MULTIPLE = 32  # the detector's input sides must be multiples of its stride
CLS_SHAPE = (48, 192)  # direction classifier input: height, width
REC_HEIGHT, REC_MIN_WIDTH = 48, 320  # recogniser input height; narrowest batch width


def bilinear(image: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Sample ``image`` [H, W, C] at fractional source coordinates (border pixels repeat).

    ``ys`` and ``xs`` broadcast to the output's [h, w]; the result is float32 [h, w, C].
    """
    h, w = image.shape[:2]
    ys = np.clip(ys, 0, h - 1)
    xs = np.clip(xs, 0, w - 1)
    y0, x0 = np.floor(ys).astype(np.intp), np.floor(xs).astype(np.intp)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (ys - y0)[..., None], (xs - x0)[..., None]
    pixels = image.astype(np.float32, copy=False)
    top = pixels[y0, x0] * (1 - wx) + pixels[y0, x1] * wx
    bottom = pixels[y1, x0] * (1 - wx) + pixels[y1, x1] * wx
    return (top * (1 - wy) + bottom * wy).astype(np.float32, copy=False)


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize to [height, width] with pixel centres aligned (OpenCV's INTER_LINEAR rule)."""
    h, w = image.shape[:2]
    ys = (np.arange(height, dtype=np.float32) + 0.5) * (h / height) - 0.5
    xs = (np.arange(width, dtype=np.float32) + 0.5) * (w / width) - 0.5
    return bilinear(image, ys[:, None], xs[None, :])


def _normalise(image: np.ndarray) -> np.ndarray:
    """[h, w, 3] pixels 0..255 -> [3, h, w] float32 in [-1, 1]."""
    return (image.astype(np.float32, copy=False).transpose(2, 0, 1) / 255.0 - 0.5) / 0.5


def det_input(image: np.ndarray) -> np.ndarray:
    """The detector's input [1, 3, H', W']: at most 960 px on the longer side, both sides multiples of 32."""
    h, w = image.shape[:2]
    ratio = min(1.0, DET_LIMIT_SIDE / max(h, w))
    height = max(DET_MULTIPLE, round(h * ratio / DET_MULTIPLE) * DET_MULTIPLE)
    width = max(DET_MULTIPLE, round(w * ratio / DET_MULTIPLE) * DET_MULTIPLE)
    return _normalise(resize(image, height, width))[None]


def _fit_height(crop: np.ndarray, height: int, max_width: int) -> np.ndarray:
    """[3, height, max_width]: the crop resized to ``height`` keeping its aspect, zero-padded on the right."""
    h, w = crop.shape[:2]
    width = min(max_width, math.ceil(height * w / h))
    padded = np.zeros((3, height, max_width), np.float32)
    padded[:, :, :width] = _normalise(resize(crop, height, width))
    return padded


def cls_input(crops: list[np.ndarray]) -> np.ndarray:
    """The direction classifier's input [n, 3, 48, 192]."""
    return np.stack([_fit_height(c, *CLS_SHAPE) for c in crops])


def rec_input(crops: list[np.ndarray]) -> np.ndarray:
    """The recogniser's input [n, 3, 48, W]: W fits the widest crop (at least 320), as PaddleOCR pads."""
    widest = max(c.shape[1] / c.shape[0] for c in crops)
    width = max(REC_MIN_WIDTH, math.ceil(REC_HEIGHT * widest))
    return np.stack([_fit_height(c, REC_HEIGHT, width) for c in crops])


def _homography(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 3x3 projective map taking the four ``src`` points onto the four ``dst`` points."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(src.tolist(), dst.tolist(), strict=True):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs += [u, v]
    return np.append(np.linalg.solve(np.array(rows), np.array(rhs)), 1.0).reshape(3, 3)


def crop_quad(image: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """The region inside ``quad`` (tl, tr, br, bl) straightened to a rectangle, as uint8 [h, w, 3].

    A crop at least 1.5 times taller than wide is vertical text: it is turned a quarter so
    the recogniser reads it left to right (PaddleOCR's rule).
    """
    quad = quad.astype(np.float64)
    width = max(1, int(max(np.linalg.norm(quad[0] - quad[1]), np.linalg.norm(quad[2] - quad[3]))))
    height = max(1, int(max(np.linalg.norm(quad[0] - quad[3]), np.linalg.norm(quad[1] - quad[2]))))
    rect = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float64)
    to_source = _homography(rect, quad)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    mapped = to_source @ np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)])
    sx = (mapped[0] / mapped[2]).reshape(height, width)
    sy = (mapped[1] / mapped[2]).reshape(height, width)
    crop = np.clip(np.rint(bilinear(image, sy, sx)), 0, 255).astype(np.uint8)
    return np.rot90(crop) if height >= 1.5 * width else crop
