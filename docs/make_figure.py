"""Draw the README's picture, docs/images/heatmap.png: the hotspot heatmap of the demo's model.

    OMP_NUM_THREADS=1 .venv/bin/python docs/make_figure.py
"""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision

import auditor
from auditor import plot

OUT = Path(__file__).resolve().parent / "images" / "heatmap.png"


def main() -> None:
    torch.manual_seed(0)
    cl = torch.channels_last
    model = torchvision.models.shufflenet_v2_x1_0().train().to(memory_format=cl)
    x = torch.randn(8, 3, 128, 128).to(memory_format=cl)
    fig = plot.heatmap(auditor.audit(model, x))
    plot.save(fig, OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
