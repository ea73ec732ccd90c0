"""Scatter/line charts as SVG (no dependency) and PNG (Pillow, when installed), from one layout.

Used for bench's throughput-vs-latency curves and tune's Pareto chart: each series is a list of
points, optionally joined by a line, each point optionally labelled (a concurrency, a config).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

WIDTH, HEIGHT = 760, 440
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 78, 170, 44, 56
PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"]


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float
    label: str = ""


@dataclass(frozen=True)
class Series:
    name: str
    points: list[Point]
    line: bool = True  # join the points, in the order given, with a line
    color: str = ""
    size: float = 4.0  # marker radius
    dashed: bool = False


@dataclass(frozen=True)
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    vertical_line: tuple[float, str] | None = None  # e.g. the p99 objective


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    ticks = [start]
    while ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _fmt(value: float) -> str:
    if abs(value) >= 10000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


@dataclass(frozen=True)
class _Layout:
    x_ticks: list[float]
    y_ticks: list[float]

    def px(self, x: float) -> float:
        lo, hi = self.x_ticks[0], self.x_ticks[-1]
        return MARGIN_LEFT + (x - lo) / (hi - lo) * (WIDTH - MARGIN_LEFT - MARGIN_RIGHT)

    def py(self, y: float) -> float:
        lo, hi = self.y_ticks[0], self.y_ticks[-1]
        return HEIGHT - MARGIN_BOTTOM - (y - lo) / (hi - lo) * (HEIGHT - MARGIN_TOP - MARGIN_BOTTOM)


def _layout(chart: Chart) -> _Layout:
    xs = [p.x for s in chart.series for p in s.points] or [0.0, 1.0]
    ys = [p.y for s in chart.series for p in s.points] or [0.0, 1.0]
    if chart.vertical_line is not None:
        xs.append(chart.vertical_line[0])
    return _Layout(nice_ticks(0.0, max(xs) * 1.05), nice_ticks(0.0, max(ys) * 1.05))


def _colors(chart: Chart) -> list[str]:
    return [s.color or PALETTE[i % len(PALETTE)] for i, s in enumerate(chart.series)]


def render_svg(chart: Chart) -> str:
    """The chart as a standalone SVG element."""
    layout, colors, esc = _layout(chart), _colors(chart), html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
           f"{esc(chart.title)}</text>"]
    left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    top, bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM
    for x in layout.x_ticks:
        px = layout.px(x)
        out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{bottom}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{px:.1f}" y="{bottom + 16}" text-anchor="middle">{_fmt(x)}</text>')
    for y in layout.y_ticks:
        py = layout.py(y)
        out.append(f'<line x1="{left}" y1="{py:.1f}" x2="{right}" y2="{py:.1f}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end">{_fmt(y)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
               'fill="none" stroke="#374151"/>')
    out.append(f'<text x="{(left + right) / 2}" y="{HEIGHT - 14}" text-anchor="middle">{esc(chart.x_label)}</text>')
    out.append(f'<text transform="translate(18 {(top + bottom) / 2}) rotate(-90)" text-anchor="middle">'
               f"{esc(chart.y_label)}</text>")
    if chart.vertical_line is not None:
        value, label = chart.vertical_line
        px = layout.px(value)
        out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{bottom}" stroke="#6b7280" '
                   'stroke-dasharray="6 4"/>')
        out.append(f'<text x="{px + 4:.1f}" y="{top + 14}" fill="#6b7280">{esc(label)}</text>')
    for series, color in zip(chart.series, colors, strict=True):
        points = series.points
        if series.line and len(points) > 1:
            path = " ".join(f"{layout.px(p.x):.1f},{layout.py(p.y):.1f}" for p in points)
            dash = ' stroke-dasharray="5 3"' if series.dashed else ""
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for p in points:
            px, py = layout.px(p.x), layout.py(p.y)
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{series.size}" fill="{color}">'
                       f"<title>{esc(series.name)} {esc(p.label)}: {p.x:g}, {p.y:g}</title></circle>")
            if p.label:
                out.append(f'<text x="{px + 6:.1f}" y="{py - 6:.1f}" font-size="10" fill="{color}">'
                           f"{esc(p.label)}</text>")
    for i, (series, color) in enumerate(zip(chart.series, colors, strict=True)):
        y = top + 8 + i * 18
        out.append(f'<rect x="{right + 14}" y="{y}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{right + 32}" y="{y + 10}">{esc(series.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def png_available() -> bool:
    try:
        import PIL.ImageDraw  # noqa: F401
    except ImportError:
        return False
    return True


def render_png(chart: Chart, path: Path) -> bool:
    """Draw the chart into a PNG with Pillow; False (nothing written) when Pillow is missing."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        return False
    layout, colors = _layout(chart), _colors(chart)
    scale = 2  # drawn at twice the size: crisp on high-density screens
    image = Image.new("RGB", (WIDTH * scale, HEIGHT * scale), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=12 * scale)
    small = ImageFont.load_default(size=10 * scale)
    title = ImageFont.load_default(size=15 * scale)

    def s(*values: float) -> list[float]:
        return [v * scale for v in values]

    def at(x: float, y: float) -> tuple[float, float]:
        return x * scale, y * scale

    left, right, top, bottom = MARGIN_LEFT, WIDTH - MARGIN_RIGHT, MARGIN_TOP, HEIGHT - MARGIN_BOTTOM
    draw.text(at(WIDTH / 2, 22), chart.title, fill="black", font=title, anchor="ms")
    for x in layout.x_ticks:
        px = layout.px(x)
        draw.line(s(px, top, px, bottom), fill="#e5e7eb", width=scale)
        draw.text(at(px, bottom + 16), _fmt(x), fill="black", font=font, anchor="ms")
    for y in layout.y_ticks:
        py = layout.py(y)
        draw.line(s(left, py, right, py), fill="#e5e7eb", width=scale)
        draw.text(at(left - 6, py + 4), _fmt(y), fill="black", font=font, anchor="rs")
    draw.rectangle(s(left, top, right, bottom), outline="#374151", width=scale)
    draw.text(at((left + right) / 2, HEIGHT - 14), chart.x_label, fill="black", font=font, anchor="ms")
    label = Image.new("RGBA", (int((bottom - top) * scale), 16 * scale), (255, 255, 255, 0))
    ImageDraw.Draw(label).text((label.width / 2, 0), chart.y_label, fill="black", font=font, anchor="mt")
    rotated = label.rotate(90, expand=True)
    image.paste(rotated, (int(8 * scale), int(top * scale)), rotated)
    if chart.vertical_line is not None:
        value, text = chart.vertical_line
        px = layout.px(value)
        for y0 in range(top, bottom, 10):
            draw.line(s(px, y0, px, min(y0 + 6, bottom)), fill="#6b7280", width=scale)
        draw.text(at(px + 4, top + 14), text, fill="#6b7280", font=font, anchor="ls")
    for series, color in zip(chart.series, colors, strict=True):
        points = series.points
        if series.line and len(points) > 1:
            draw.line([v for p in points for v in s(layout.px(p.x), layout.py(p.y))], fill=color, width=2 * scale)
        for p in points:
            px, py, r = layout.px(p.x), layout.py(p.y), series.size
            draw.ellipse(s(px - r, py - r, px + r, py + r), fill=color)
            if p.label:
                draw.text(at(px + 6, py - 6), p.label, fill=color, font=small, anchor="ls")
    for i, (series, color) in enumerate(zip(chart.series, colors, strict=True)):
        y = top + 8 + i * 18
        draw.rectangle(s(right + 14, y, right + 26, y + 12), fill=color)
        draw.text(at(right + 32, y + 10), series.name, fill="black", font=font, anchor="ls")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)
    return True
