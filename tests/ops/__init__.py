"""Per-op reference, batching and DyNet-parity tests."""
