"""Image files for the Image Transformer's examples and tests (not model code, so it does not ship in Hub repos)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import torch

from ..txv_files import atomic_write_bytes


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
    atomic_write_bytes(Path(path).resolve(), png_bytes(images, scale))


def synthetic_shapes(count: int, size: int = 16, channels: int = 1, seed: int = 0) -> torch.Tensor:
    """uint8 `[count, size, size, channels]` images made from nothing (no download): a soft linear gradient with one
    filled rectangle and one filled disc of random intensities and places. Smooth areas and sharp edges, so that a
    low-resolution copy says much, but not everything, about the image."""
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.rand(*shape, generator=generator)  # noqa: E731
    coords = torch.arange(size, dtype=torch.float32)
    rows, cols = coords[:, None].expand(size, size), coords[None, :].expand(size, size)
    images = []
    for _ in range(count):
        direction = rand(2) - 0.5
        image = 96 + 64 * (direction[0] * rows + direction[1] * cols) / size
        image = image[..., None].repeat(1, 1, channels)
        top, left = (rand(2) * size * 0.6).long()
        height, width = 3 + (rand(2) * size * 0.4).long()
        image[top : top + height, left : left + width] = 255 * rand(channels)
        centre, radius = rand(2) * size, 2 + rand(1) * size / 4
        disc = (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 <= radius**2
        image[disc] = 255 * rand(channels)
        images.append(image)
    return torch.stack(images).clamp(0, 255).round().to(torch.uint8)


def downsample(images: torch.Tensor, factor: int) -> torch.Tensor:
    """Average `factor` x `factor` pixel blocks: uint8 `[batch, H, W, C]` -> `[batch, H / factor, W / factor, C]`."""
    if images.shape[1] % factor or images.shape[2] % factor:
        raise ValueError(f"image size {tuple(images.shape[1:3])} must be a multiple of factor {factor}")
    pooled = torch.nn.functional.avg_pool2d(images.permute(0, 3, 1, 2).float(), factor)
    return pooled.permute(0, 2, 3, 1).round().to(torch.uint8)
