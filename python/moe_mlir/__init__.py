"""moe_mlir: Python side of the moe-mlir CPU reference path (NumPy only).

- `moe_mlir.config`: `LayerConfig`
- `moe_mlir.reference`: NumPy reference of the layer, forward and backward
- `moe_mlir.mlir_text`: MLIR text of a layer (`layer_mlir`)
- `moe_mlir.cpu`: run moe-opt, compile the lowered module with clang, call it with ctypes
"""

from .config import LayerConfig, capacity_for

__all__ = ["LayerConfig", "capacity_for"]
