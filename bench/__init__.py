"""Benchmark harness: dynagraph vs DyNet vs PyTorch vs hand-batched numpy. See bench/README.md."""
