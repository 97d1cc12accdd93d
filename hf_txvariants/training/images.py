"""Image files for the Image Transformer's examples and tests (not model code, so it does not ship in Hub repos)."""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from pathlib import Path

import torch


def png_bytes(images: torch.Tensor, scale: int = 4) -> bytes:
    """uint8 `[batch, height, width, channels]` (1 or 3 channels) side by side as one PNG, each pixel `scale` x
    `scale` (stdlib only)."""
    if images.dim() != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"images must be [batch, height, width, 1 or 3], got shape {tuple(images.shape)}")
    images = images.to(torch.uint8).cpu()
    row = torch.cat(list(images), dim=1)  # [height, batch * width, channels]
    row = row.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    height, width = row.shape[:2]
    raw = b"".join(b"\x00" + bytes(row[y].flatten().tolist()) for y in range(height))
    colour = {1: 0, 3: 2}[images.shape[-1]]

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def save_png(images: torch.Tensor, path, scale: int = 4) -> None:
    """Writes `png_bytes(images, scale)` to `path` atomically (a temporary file renamed into place)."""
    path = Path(path)
    data = png_bytes(images, scale)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
