"""Small models written the way users write them, for the breadth corpus (issue 38 item 6): the
model in the script being run, each pattern inline in ``forward``, not a library's helper.

``benchmarks/breadth.py`` runs each one twice: as this script (``python user_models.py
--worker ...``, so the classes live in ``__main__``, as in ``python train.py``) and as a notebook's
cells executed by a Jupyter kernel (nbclient), the classes in a cell. Run alone, it lists them.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class ShuffleNet(nn.Module):
    """A channel shuffle between two grouped convolutions, written in one line."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.a = nn.Conv2d(c, c, 1, groups=2)
        self.b = nn.Conv2d(c, c, 3, padding=1, groups=2)
        self.head = nn.Conv2d(c, 10, 1)

    def forward(self, x):
        f = F.relu(self.a(self.stem(x)))
        n, c, h, w = f.shape
        f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        f = F.relu(self.b(f))
        return self.head(f).mean((2, 3))


class ChannelSoftmax(nn.Module):
    """Attention over the channels: a softmax along dim 1 of a map."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.mix = nn.Conv2d(c, c, 3, padding=1)
        self.head = nn.Conv2d(c, 10, 1)

    def forward(self, x):
        f = self.stem(x)
        weights = torch.softmax(f, dim=1)
        f = self.mix(f * weights)
        return self.head(f).flatten(2).mean(2)


class CoordConv(nn.Module):
    """Features concatenated with a coordinate map the model makes itself (a cat of mixed formats)."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.conv = nn.Conv2d(c + 2, c, 3, padding=1)
        self.head = nn.Conv2d(c, 10, 1)

    def forward(self, x):
        f = self.stem(x)
        n, _, h, w = f.shape
        ys = torch.linspace(-1, 1, h, device=f.device).view(1, 1, h, 1).expand(n, 1, h, w)
        xs = torch.linspace(-1, 1, w, device=f.device).view(1, 1, 1, w).expand(n, 1, h, w)
        f = torch.cat([f, ys, xs], dim=1)
        return self.head(F.relu(self.conv(f))).mean((2, 3))


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation with the mean over H and W kept 4-D."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.reduce = nn.Conv2d(c, c // 4, 1)
        self.expand = nn.Conv2d(c // 4, c, 1)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.head = nn.Conv2d(c, 10, 1)

    def forward(self, x):
        f = F.relu(self.stem(x))
        s = f.mean((2, 3), keepdim=True)
        s = torch.sigmoid(self.expand(F.relu(self.reduce(s))))
        f = self.conv(f * s)
        return self.head(f).mean((2, 3))


class SpatialAttention(nn.Module):
    """Self-attention over the pixels: the map reshaped to (N, C, H*W) and back."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)
        self.head = nn.Conv2d(c, 10, 1)

    def forward(self, x):
        f = self.stem(x)
        n, c, h, w = f.shape
        q, k, v = self.qkv(f).chunk(3, dim=1)
        q, k, v = q.reshape(n, c, h * w), k.reshape(n, c, h * w), v.reshape(n, c, h * w)
        attn = torch.softmax(q.transpose(1, 2) @ k / c ** 0.5, dim=-1)
        out = (v @ attn.transpose(1, 2)).reshape(n, c, h, w)
        f = f + self.proj(out)
        return self.head(f).mean((2, 3))


class WindowConv(nn.Module):
    """A convolution run on windows: the map partitioned into ws x ws windows and put back."""

    def __init__(self, c=16, ws=4):
        super().__init__()
        self.ws = ws
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.local = nn.Conv2d(c, c, 3, padding=1)
        self.head = nn.Conv2d(c, 10, 1)

    def forward(self, x):
        f = self.stem(x)
        n, c, h, w = f.shape
        ws = self.ws
        win = f.view(n, c, h // ws, ws, w // ws, ws).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, ws, ws)
        win = self.local(win)
        f = win.view(n, h // ws, w // ws, c, ws, ws).permute(0, 3, 1, 4, 2, 5).reshape(n, c, h, w)
        return self.head(F.relu(f)).mean((2, 3))


#: the models, by name (each built with no argument, random weights; input N x 3 x 32 x 32)
MODELS = {cls.__name__: cls for cls in (ShuffleNet, ChannelSoftmax, CoordConv, SqueezeExcite, SpatialAttention,
                                         WindowConv)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # breadth.py's worker, with the models of this script (__main__)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import breadth

        sys.exit(breadth.main(sys.argv[1:], user_models=MODELS))
    print("\n".join(MODELS))
