"""DB (differentiable binarisation) post-processing in numpy: the detector's text-probability map
-> text boxes as four corners (tl, tr, br, bl) in the input image's pixels.

Same steps and constants as PaddleOCR / RapidOCR (threshold 0.3, 2x2 dilation, box score >= 0.5,
unclip ratio 1.6, sides >= 3 px), with connected components in place of OpenCV's contours: each
8-connected region of the binary map gives the minimum-area rectangle around its pixels.
"""

import numpy as np

THRESH = 0.3  # a pixel is text when its probability exceeds this
BOX_THRESH = 0.5  # a region is kept when its mean probability inside its box reaches this
UNCLIP_RATIO = 1.6  # how far a box grows back out (DB shrinks text regions while training)
MIN_SIZE = 3  # boxes with a shorter side (map pixels) are noise
MAX_CANDIDATES = 1000


def binarise(prob: np.ndarray) -> np.ndarray:
    """Threshold, then dilate with a 2x2 kernel (a pixel is set if it or its right/lower neighbours are)."""
    mask = prob > THRESH
    grown = mask.copy()
    grown[:, :-1] |= mask[:, 1:]
    grown[:-1, :] |= mask[1:, :]
    grown[:-1, :-1] |= mask[1:, 1:]
    return grown


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Horizontal runs of set pixels: (row, first column, one past the last column), row-major."""
    padded = np.zeros((mask.shape[0], mask.shape[1] + 2), np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    starts, ends = np.argwhere(edges == 1), np.argwhere(edges == -1)
    return starts[:, 0], starts[:, 1], ends[:, 1]


def components(mask: np.ndarray) -> list[np.ndarray]:
    """8-connected regions of ``mask``, each as its pixel runs' end points [k, 2] (x, y)."""
    rows, first, last = _runs(mask)
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    row_start = np.searchsorted(rows, np.arange(mask.shape[0] + 1))
    for r in range(mask.shape[0] - 1):
        above, below = range(row_start[r], row_start[r + 1]), range(row_start[r + 1], row_start[r + 2])
        j = below.start
        for i in above:  # runs touch (8-connected) when they overlap after growing by one column
            while j < below.stop and last[j] < first[i]:
                j += 1
            k = j
            while k < below.stop and first[k] <= last[i]:
                parent[root(k)] = root(i)
                k += 1
    groups: dict[int, list[int]] = {}
    for i in range(len(rows)):
        groups.setdefault(root(i), []).append(i)
    regions = []
    for members in groups.values():
        idx = np.array(members)
        ys = np.concatenate([rows[idx], rows[idx]])
        xs = np.concatenate([first[idx], last[idx] - 1])
        regions.append(np.stack([xs, ys], axis=1).astype(np.float64))
    return regions


def _hull(points: np.ndarray) -> np.ndarray:
    """Convex hull (Andrew's monotone chain), counter-clockwise, no repeated end point."""
    pts = sorted(set(map(tuple, points.tolist())))
    if len(pts) < 3:
        return np.array(pts, np.float64)

    def half(seq: list[tuple[float, float]]) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        for p in seq:
            while len(out) >= 2 and (
                (out[-1][0] - out[-2][0]) * (p[1] - out[-2][1]) - (out[-1][1] - out[-2][1]) * (p[0] - out[-2][0])
            ) <= 0:
                out.pop()
            out.append(p)
        return out

    return np.array(half(pts)[:-1] + half(pts[::-1])[:-1], np.float64)


def min_area_rect(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The smallest rectangle around ``points``: centre, (width, height), and its two unit axes [2, 2].

    One side of the optimum lies along a hull edge (rotating calipers), so every edge direction is tried.
    """
    hull = _hull(points)
    if len(hull) < 3:  # a point or a segment: a degenerate rectangle along it
        span = hull[-1] - hull[0]
        axis = span / np.linalg.norm(span) if np.linalg.norm(span) > 0 else np.array([1.0, 0.0])
        axes = np.stack([axis, [-axis[1], axis[0]]])
    else:
        edges = np.roll(hull, -1, axis=0) - hull
        edges = edges[np.linalg.norm(edges, axis=1) > 0]
        units = edges / np.linalg.norm(edges, axis=1, keepdims=True)
        along, across = units @ hull.T, np.stack([-units[:, 1], units[:, 0]], axis=1) @ hull.T
        areas = np.ptp(along, axis=1) * np.ptp(across, axis=1)
        best = units[int(np.argmin(areas))]
        axes = np.stack([best, [-best[1], best[0]]])
    proj = hull @ axes.T
    low, high = proj.min(axis=0), proj.max(axis=0)
    centre = ((low + high) / 2) @ axes
    return centre, high - low, axes


def corners(centre: np.ndarray, size: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """The rectangle's corners ordered tl, tr, br, bl (image coordinates: y grows downwards)."""
    half = size / 2
    pts = np.array([centre + sx * half[0] * axes[0] + sy * half[1] * axes[1]
                    for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))])
    return order_corners(pts)


def order_corners(pts: np.ndarray) -> np.ndarray:
    """tl, tr, br, bl: the two leftmost points are tl (upper) and bl, the two rightmost tr and br."""
    by_x = pts[np.argsort(pts[:, 0], kind="stable")]
    left, right = by_x[:2], by_x[2:]
    tl, bl = left[np.argsort(left[:, 1], kind="stable")]
    tr, br = right[np.argsort(right[:, 1], kind="stable")]
    return np.array([tl, tr, br, bl], np.float32)


def box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability of the map pixels inside the (convex) quadrilateral ``box``."""
    h, w = prob.shape
    x0, y0 = np.clip(np.floor(box.min(axis=0)).astype(int), 0, [w - 1, h - 1])
    x1, y1 = np.clip(np.ceil(box.max(axis=0)).astype(int), 0, [w - 1, h - 1])
    ys, xs = np.mgrid[y0 : y1 + 1, x0 : x1 + 1]
    inside = np.ones(xs.shape, bool)
    for a, b in zip(box, np.roll(box, -1, axis=0), strict=True):  # clockwise on screen: cross >= 0 inside
        inside &= (b[0] - a[0]) * (ys - a[1]) - (b[1] - a[1]) * (xs - a[0]) >= -0.5 * np.hypot(*(b - a))
    window = prob[y0 : y1 + 1, x0 : x1 + 1]
    return float(window[inside].mean()) if inside.any() else 0.0


def boxes_from_map(prob: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Text boxes [n, 4, 2] int32 in an image of ``height`` x ``width`` pixels, and their scores [n].

    ``prob`` is the detector's map [H', W'] for that image resized to H' x W'.
    """
    map_h, map_w = prob.shape
    boxes, scores = [], []
    for region in components(binarise(prob))[:MAX_CANDIDATES]:
        centre, size, axes = min_area_rect(region)
        if size.min() < MIN_SIZE:
            continue
        score = box_score(prob, corners(centre, size, axes))
        if score < BOX_THRESH:
            continue
        # Unclip: grow every side by area * ratio / perimeter (what a rounded polygon offset does to a rectangle).
        grow = size.prod() * UNCLIP_RATIO / (2 * size.sum())
        size = size + 2 * grow
        if size.min() < MIN_SIZE + 2:
            continue
        box = corners(centre, size, axes)
        box[:, 0] = np.clip(np.round(box[:, 0] / map_w * width), 0, width - 1)
        box[:, 1] = np.clip(np.round(box[:, 1] / map_h * height), 0, height - 1)
        if np.linalg.norm(box[0] - box[1]) <= 3 or np.linalg.norm(box[0] - box[3]) <= 3:
            continue
        boxes.append(box.astype(np.int32))
        scores.append(score)
    order = reading_order(boxes)
    return (np.array([boxes[i] for i in order], np.int32).reshape(-1, 4, 2),
            np.array([scores[i] for i in order], np.float32))


def reading_order(boxes: list[np.ndarray]) -> list[int]:
    """Indices of ``boxes`` top to bottom, and left to right among boxes whose tops are within 10 px."""
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][0][1], boxes[i][0][0]))
    for n in range(len(order) - 1):
        for j in range(n, -1, -1):
            a, b = boxes[order[j]][0], boxes[order[j + 1]][0]
            if abs(int(b[1]) - int(a[1])) < 10 and b[0] < a[0]:
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return order
