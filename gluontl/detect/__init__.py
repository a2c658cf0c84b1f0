"""Object detection: data, metrics, drawing and export (issue 12)."""
