import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)  # tests/helpers.py
sys.path.insert(0, os.path.join(HERE, "onnx"))  # tests/onnx/opcheck.py
