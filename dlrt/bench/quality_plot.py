"""`dlrt bench quality`'s PNG: TPF against held-out token accuracy, one colour per setting (named
in a legend beside the axes, so no label sits on a point or on another label), one marker per
block length, a setting's points joined across block lengths, and points that fall together
(settings that decide alike) set side by side; the title names the model and what was
measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MARKERS = "osD^v<>ph*"
DODGE_PT = 8.0  # points between the markers of points that fall together


def dodges(points: list[tuple[float, float]]) -> list[float]:
    """A horizontal offset in points for each of `points`: 0 for a point alone; points within
    1% of the axes' spans of each other are spread DODGE_PT apart around their place."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    dx = (max(xs) - min(xs)) or 1.0
    dy = (max(ys) - min(ys)) or 1.0
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (x, y) in enumerate(points):
        groups.setdefault((round(x / dx * 100), round(y / dy * 100)), []).append(i)
    out = [0.0] * len(points)
    for members in groups.values():
        for k, i in enumerate(members):
            out[i] = (k - (len(members) - 1) / 2) * DODGE_PT
    return out


def figure(rows: list[dict[str, Any]], title: str):
    """The matplotlib Figure of `rows` (the table's rows) under `title`.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import offset_copy

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    blocks = sorted({r["block"] for r in rows})
    colours = plt.get_cmap("tab20" if len(settings) > 10 else "tab10")
    fig, ax = plt.subplots(figsize=(10, 5.5))
    shift = dodges([(r["tpf"], r["token_accuracy"]) for r in rows])
    for i, setting in enumerate(settings):
        colour = colours(i % colours.N)
        mine = sorted((r for r in rows if r["setting"] == setting), key=lambda r: r["block"])
        ax.plot([r["tpf"] for r in mine], [r["token_accuracy"] for r in mine], "-",
                color=colour, alpha=0.4, linewidth=1)
        ax.plot([], [], "-", color=colour, linewidth=5, label=setting)  # its legend entry
    for r, dx in zip(rows, shift, strict=True):
        ax.scatter(r["tpf"], r["token_accuracy"], s=36,
                   color=colours(settings.index(r["setting"]) % colours.N),
                   marker=MARKERS[blocks.index(r["block"]) % len(MARKERS)],
                   transform=offset_copy(ax.transData, fig=fig, x=dx, y=0, units="points"))
    for j, block in enumerate(blocks):
        ax.scatter([], [], marker=MARKERS[j % len(MARKERS)], color="0.3",
                   label=f"block {block}")
    ax.set_xlabel("tokens per forward (TPF)")
    ax.set_ylabel("held-out continuation token accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    """`figure(rows, title)` as a PNG at `path`; False without matplotlib."""
    try:
        fig = figure(rows, title)
    except ImportError:
        return False
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
