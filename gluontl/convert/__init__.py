"""Converters that turn third-party pretrained weights into standard ONNX files, without
the framework that wrote them (see :mod:`.efficientnet_lite`)."""
