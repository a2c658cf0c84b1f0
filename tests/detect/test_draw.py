"""Drawn boxes land on the right pixels, and detections.json holds the kept detections in
original-image pixels."""
import json

import numpy as np
import pytest
from PIL import Image

from gluontl.detect.draw import class_color, draw_detections, write_predictions
from gluontl.errors import DataError

NAMES = ["cat", "dog", "bird"]


def _gray(h=160, w=200):
    return np.full((h, w, 3), 90, np.uint8)


def test_a_thin_box_changes_its_border_and_nothing_inside():
    image = _gray()
    out = draw_detections(image, np.array([[1, 0.87, 40, 60, 160, 140]], np.float32), NAMES, thickness=1)
    color = class_color(1)
    for y, x in ((100, 40), (100, 160), (140, 100), (60, 150)):  # left, right, bottom, top edges
        assert tuple(out[y, x]) == color, (y, x)
    np.testing.assert_array_equal(out[62:139, 42:159], image[62:139, 42:159])  # interior, past the label
    np.testing.assert_array_equal(out[141:, :], image[141:, :])  # below the box
    assert (out[:59, 40:60] != 90).any()  # the label sits above the box
    np.testing.assert_array_equal(image, _gray())  # the input is not drawn on


def test_padding_and_low_scores_draw_nothing():
    image = _gray()
    dets = np.array([[-1, 0.99, 10, 10, 100, 100], [0, 0.25, 10, 10, 100, 100], [-1, -1, -1, -1, -1, -1]], np.float32)
    np.testing.assert_array_equal(draw_detections(image, dets, NAMES, score_thresh=0.3), image)
    assert (draw_detections(image, dets, NAMES, score_thresh=0.1) != image).any()
    assert (draw_detections(image, dets, NAMES, score_thresh=0.25) != image).any()  # the threshold itself is kept


def test_each_class_has_its_own_colour():
    colors = [class_color(c) for c in range(20)]
    assert len(set(colors)) == 20
    out = draw_detections(_gray(), np.array([[0, 0.9, 10, 40, 60, 90], [2, 0.9, 110, 40, 190, 90]]), NAMES, thickness=1)
    assert tuple(out[65, 10]) == class_color(0) and tuple(out[65, 110]) == class_color(2)


def test_an_unknown_class_id_is_refused():
    with pytest.raises(DataError, match="class id 3, but there are 3 class names"):
        draw_detections(_gray(), np.array([[3, 0.9, 10, 10, 50, 50]]), NAMES)


def test_write_predictions_images_and_json_in_original_pixels(tmp_path):
    """Network input 100x100 (H, W); image a is 200x300, so x scales by 3 and y by 2."""
    a, b = _gray(200, 300), _gray(50, 80)
    dets_a = np.array([[1, 0.9, 10, 20, 40, 60],      # -> x 30..120, y 40..120
                       [0, 0.95, -5, 90, 50, 110],     # -> clipped: x 0..150, y 180..200
                       [2, 0.1, 10, 10, 20, 20],       # below the threshold
                       [-1, -1, -1, -1, -1, -1]], np.float32)
    dets_b = np.full((3, 6), -1, np.float32)
    out = tmp_path / "pred"
    path = write_predictions(out, [("imgs/one/x.png", a, dets_a), ("imgs/two/x.jpg", b, dets_b)], NAMES, (100, 100),
                             score_thresh=0.5)
    doc = json.loads(path.read_text())
    assert doc["classes"] == NAMES and doc["score_thresh"] == 0.5
    first, second = doc["images"]
    assert (first["file"], first["output"], first["width"], first["height"]) == ("imgs/one/x.png", "x.jpg", 300, 200)
    assert first["detections"] == [
        {"class": "cat", "class_id": 0, "score": pytest.approx(0.95), "box": [0.0, 180.0, 150.0, 200.0]},
        {"class": "dog", "class_id": 1, "score": pytest.approx(0.9), "box": [30.0, 40.0, 120.0, 120.0]}]
    assert (second["output"], second["width"], second["height"], second["detections"]) == ("x_2.jpg", 80, 50, [])
    assert sorted(p.name for p in out.iterdir()) == ["detections.json", "x.jpg", "x_2.jpg"]
    with Image.open(out / "x.jpg") as im:
        assert im.format == "JPEG" and im.size == (300, 200)
        drawn = np.asarray(im.convert("RGB")).astype(int)
    # JPEG smears a 1 px line over its neighbours: the dog box's left edge (x = 30, y 40..120) is
    # far from the gray, its inside and the columns beside it are not
    def off(region):
        return np.abs(drawn[region] - 90).mean()

    assert off(np.s_[50:110, 30]) > 20  # 28 measured, 70 before compression
    assert off(np.s_[50:110, 34:116]) < 4 and off(np.s_[50:110, 10:26]) < 4 and off(np.s_[125:170, 30:120]) < 4
    with Image.open(out / "x_2.jpg") as im:
        assert np.abs(np.asarray(im.convert("RGB")).astype(int) - 90).max() <= 2  # nothing drawn


def test_write_predictions_never_overwrites_an_input_image(tmp_path):
    src = tmp_path / "x.jpg"
    Image.fromarray(_gray()).save(src)
    before = src.read_bytes()
    with pytest.raises(DataError, match="would overwrite the input image"):
        write_predictions(tmp_path, [(src, _gray(), np.zeros((0, 6)))], NAMES, (160, 200))
    assert src.read_bytes() == before


def test_an_output_folder_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "pred").write_text("not a folder")
    with pytest.raises(DataError, match="Cannot create the predictions folder"):
        write_predictions(tmp_path / "pred", [("x.jpg", _gray(), np.zeros((0, 6)))], NAMES, (160, 200))
