"""ONNX → trainable Gluon SymbolBlock importer (a registry of per-op converters)."""
