"""Semantic segmentation's own pieces: mask formats, metrics, loss, joint augmentation, demo data.

Nothing here knows the training loop; ``gluontl/tasks/segmentation.py`` wires them in.
"""
