"""Detection annotations: our own readers and writers for VOC XML, COCO JSON and YOLO txt.

GluonCV's dataset classes are not used: ``VOCDetection`` crashes on a missing ``<difficult>``,
``CustomVOCDetection(generate_classes=True)`` does not generate classes, and ``COCODetection``
pip-installs pycocotools at run time and wants the COCO-80 names.

Every reader returns :class:`Annotation` records whose ``labels`` are float32 ``(N, 6)``
``[xmin, ymin, xmax, ymax, class_id, difficult]`` in continuous pixel coordinates
(``0 <= xmin < xmax <= width``), ``class_id`` indexing the class names the reader returns.

Coordinate conventions (what the writers invert):

- **VOC** stores 1-based inclusive pixel indices: pixel ``i`` covers ``[i - 1, i)``, so
  ``<xmin>`` becomes ``xmin - 1`` and ``<xmax>`` stays ``xmax`` (a box of one pixel column has
  ``xmin == xmax``). GluonCV subtracts 1 from all four, which shrinks every box by a pixel; we
  do not. Allowed: ``1 <= xmin <= xmax <= width`` - no tolerance, since a 0 or ``width + 1``
  means the file was written by a 0-based tool and every box of it is one pixel off. The
  writer rounds each edge to the nearest pixel edge (at most 0.5 px per edge; a side that
  rounds to nothing becomes the one pixel holding its left/top edge), so integer boxes round-trip
  exactly. A missing ``<difficult>`` is 0; a missing ``<size>`` is read from the image. The
  image is ``<filename>`` in the images folder, or, where no such file exists, the image
  named like the XML file (any image extension).
- **COCO** ``bbox`` is ``[x, y, w, h]`` in pixels: ``[x, y, x + w, y + h]``; ``iscrowd`` is
  the ``difficult`` flag (both are left out of mAP rather than counted as misses). Classes
  are the ``categories`` in id order. Round-trips exactly (float32 values as JSON doubles).
- **YOLO** stores ``class cx cy w h`` normalized by the image size, one ``.txt`` per image
  (missing or empty: an image without objects); the size comes from the image file (EXIF
  orientation applied, as decoding does). Written with 8 decimals: a round trip moves an
  edge by less than ``1e-8 * size`` px plus float32 rounding.

Edges within 1/1000 px outside the image are float rounding (normalized or summed
coordinates) and are snapped to the border; anything further out, empty or inverted boxes,
class names or ids the file does not declare, and malformed files are ``DataError`` naming
the file and the object (VOC: object index, COCO: annotation id, YOLO: line).

The writers fill a folder with plain writes, not one atomic write per file (a dataset is
thousands of small files and an fsync each costs seconds): write into a new folder and rename
it into place, as the demo (``gluontl.data.demo.materialize``) does.
"""
from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import yaml

from ..atomic import link_or_copy
from ..data.transforms import open_image
from ..errors import DataError
from ..readers import read_bytes, read_json, read_text, read_yaml
from ..recipe import suggest

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif")
_EPS = 1e-3  # px: how far outside the image float rounding may put an edge
MAX_COCO_BYTES = 1 << 30  # COCO 2017's train instances file is 448 MB
MAX_XML_BYTES = 16 << 20  # a VOC annotation is a few kB
_EXIF_ORIENTATION = 274
_EXIF_SWAPS = (5, 6, 7, 8)  # orientations that rotate by 90 degrees


@dataclass
class Annotation:
    """One image's ground truth; ``size`` is None when the image could not be read (YOLO needs
    it to place boxes; such items are left out by the loader's bad-image pass)."""

    image: Path
    size: tuple[int, int] | None  # (width, height)
    labels: np.ndarray  # float32 (N, 6): xmin, ymin, xmax, ymax, class_id, difficult
    source: str  # the annotation file (and entry) it came from, for messages


def image_size(path: Path) -> tuple[int, int] | None:
    """(width, height) after EXIF orientation, from the header only; None if unreadable."""
    try:
        with open_image(path) as im:
            w, h = im.size
            return (h, w) if im.getexif().get(_EXIF_ORIENTATION) in _EXIF_SWAPS else (w, h)
    except DataError:  # the bad-image pass says why
        return None


def check_box(box: Sequence[float], size: tuple[int, int], where: str) -> list[float]:
    """A continuous ``[xmin, ymin, xmax, ymax]`` checked against the image, rounding snapped."""
    w, h = size
    x0, y0, x1, y1 = (float(v) for v in box)
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)):
        raise DataError(f"{where}: box {[x0, y0, x1, y1]} has a non-finite coordinate. Fix the annotation.")
    if x1 <= x0 or y1 <= y0:
        raise DataError(f"{where}: box [xmin {x0:g}, ymin {y0:g}, xmax {x1:g}, ymax {y1:g}] is empty "
                        f"(xmax <= xmin or ymax <= ymin). Fix or delete the object.")
    if x0 < -_EPS or y0 < -_EPS or x1 > w + _EPS or y1 > h + _EPS:
        raise DataError(f"{where}: box [xmin {x0:g}, ymin {y0:g}, xmax {x1:g}, ymax {y1:g}] lies outside "
                        f"the {w}x{h} image. Fix the annotation (or its image size); gluontl does not clip "
                        f"boxes silently.")
    return [max(x0, 0.0), max(y0, 0.0), min(x1, float(w)), min(y1, float(h))]


def _labels(rows: list[list[float]]) -> np.ndarray:
    return np.array(rows, np.float32).reshape(-1, 6)


def unknown_class(name: Any, valid: Iterable[str], where: str) -> DataError:
    return DataError(f"{where}: class {name!r} is not one of the dataset's classes{suggest(str(name), valid)}. "
                     f"Fix the annotation or the class list.")


# ---------------------------------------------------------------- VOC

def read_voc_xml(xml: Path, image_dir: Path) -> tuple[Annotation, list[str]]:
    """One VOC annotation file; class_id indexes the returned per-object names (the caller maps
    names to ids, since VOC declares no class list)."""
    text = read_bytes(xml, DataError, "the VOC annotation", max_bytes=MAX_XML_BYTES)
    try:  # expat (>= 2.4) bounds entity expansion, the billion-laughs bomb of XML
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise DataError(f"Cannot read VOC annotation '{xml}': {e}. Fix or delete the file.") from None
    image = _voc_image(root.findtext("filename"), xml, image_dir)
    size_el = root.find("size")
    if size_el is not None:
        try:
            size = (int(float(size_el.findtext("width", ""))), int(float(size_el.findtext("height", ""))))
        except ValueError:
            raise DataError(f"{xml}: <size> needs numeric <width> and <height>. Fix the file.") from None
        if min(size) <= 0:
            raise DataError(f"{xml}: <size> is {size[0]}x{size[1]}; both must be > 0. Fix the file.")
    else:
        size = image_size(image)
    names: list[str] = []
    rows: list[list[float]] = []
    for k, obj in enumerate(root.iter("object")):
        where = f"{xml}, object {k}"
        cls = (obj.findtext("name") or "").strip()
        box = obj.find("bndbox")
        if not cls or box is None:
            raise DataError(f"{where}: needs <name> and <bndbox>. Fix the file.")
        try:
            x0, y0, x1, y1 = (float(box.findtext(t, "")) for t in ("xmin", "ymin", "xmax", "ymax"))
            difficult = int(float(obj.findtext("difficult") or 0))
        except ValueError:
            raise DataError(f"{where}: <bndbox> needs numeric <xmin>, <ymin>, <xmax>, <ymax> (and "
                            f"<difficult> 0 or 1). Fix the file.") from None
        if size is None:
            continue  # the image is unreadable: the bad-image pass reports it
        if not (1 <= x0 <= x1 <= size[0] and 1 <= y0 <= y1 <= size[1]):
            raise DataError(f"{where}: box xmin {x0:g}, ymin {y0:g}, xmax {x1:g}, ymax {y1:g} is outside "
                            f"the {size[0]}x{size[1]} image or inverted. VOC coordinates are 1-based "
                            f"inclusive pixel indices: 1 <= xmin <= xmax <= width, 1 <= ymin <= ymax <= "
                            f"height. Fix the annotation; gluontl does not clip boxes silently.")
        names.append(cls)
        rows.append([x0 - 1, y0 - 1, x1, y1, len(names) - 1, 1.0 if difficult else 0.0])
    return Annotation(image, size, _labels(rows), str(xml)), names


def _voc_image(filename: str | None, xml: Path, image_dir: Path) -> Path:
    """``<filename>``; where that file is absent (no tag, or a tag without or with another
    extension, as converted datasets have), the image named like the XML, if there is one."""
    named = image_dir / filename.strip() if filename and filename.strip() else None
    if named is not None and named.is_file():
        return named
    same_stem = [image_dir / f"{xml.stem}{ext}" for ext in IMAGE_EXTENSIONS]
    return next((p for p in same_stem if p.is_file()), named or same_stem[0])


def voc_xml(ann: Annotation, class_names: Sequence[str]) -> str:
    """The VOC XML text of one annotation (see the module doc for the rounding)."""
    w, h = ann.size
    root = ET.Element("annotation")
    ET.SubElement(root, "filename").text = ann.image.name
    size = ET.SubElement(root, "size")
    for tag, v in (("width", w), ("height", h), ("depth", 3)):
        ET.SubElement(size, tag).text = str(v)
    for x0, y0, x1, y1, c, d in ann.labels.tolist():
        obj = ET.SubElement(root, "object")
        ET.SubElement(obj, "name").text = class_names[int(c)]
        ET.SubElement(obj, "difficult").text = str(int(d))
        box = ET.SubElement(obj, "bndbox")
        (a, b), (e, f) = _pixel_edges(x0, x1), _pixel_edges(y0, y1)
        for tag, v in (("xmin", a + 1), ("ymin", e + 1), ("xmax", b), ("ymax", f)):
            ET.SubElement(box, tag).text = str(v)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def _pixel_edges(lo: float, hi: float) -> tuple[int, int]:
    a, b = round(lo), round(hi)
    return (a, b) if b > a else (math.floor(lo), math.floor(lo) + 1)


def write_voc(root: Path, splits: Mapping[str, Sequence[Annotation]], class_names: Sequence[str]) -> None:
    """``root/Annotations/*.xml``, ``root/ImageSets/Main/<split>.txt`` and the images linked into
    ``root/JPEGImages`` (image file names must be unique across splits)."""
    for sub in ("Annotations", "ImageSets/Main", "JPEGImages"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for split, anns in splits.items():
        for ann in anns:
            _write(root / "Annotations" / f"{ann.image.stem}.xml", voc_xml(ann, class_names))
            _place(ann.image, root / "JPEGImages" / ann.image.name)
        _write(root / "ImageSets" / "Main" / f"{split}.txt",
                   "".join(f"{a.image.stem}\n" for a in anns))


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _place(src: Path, dst: Path) -> None:
    if dst.exists():
        if os.path.samefile(src, dst):
            return
        dst.unlink()
    link_or_copy(src, dst)


# ---------------------------------------------------------------- COCO

def read_coco(json_path: Path, image_dir: Path) -> tuple[list[Annotation], list[str]]:
    """All images of one COCO instances file (images without annotations included), classes
    the categories in id order."""
    data = read_json(json_path, DataError, "COCO annotations", max_bytes=MAX_COCO_BYTES)
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations",
                                                                                  "categories")):
        raise DataError(f"'{json_path}' is not a COCO instances file: it needs lists 'images', 'annotations' "
                        f"and 'categories'.")
    try:
        cats = sorted((int(c["id"]), str(c["name"])) for c in data["categories"])
        images = {int(im["id"]): (str(im["file_name"]), (int(im["width"]), int(im["height"])))
                  for im in data["images"]}
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{json_path}: a category needs id and name, an image id, file_name, width and height "
                        f"({type(e).__name__}: {e}). Fix the file.") from None
    if len(images) != len(data["images"]) or len({c for c, _ in cats}) != len(cats):
        raise DataError(f"{json_path}: image or category ids repeat. Fix the file.")
    names = [n for _, n in cats]
    cat_index = {c: i for i, (c, _) in enumerate(cats)}
    rows: dict[int, list[list[float]]] = {i: [] for i in images}
    for k, a in enumerate(data["annotations"]):
        where = f"{json_path}, annotation {a.get('id', f'#{k}') if isinstance(a, dict) else f'#{k}'}"
        try:
            image_id, cat, bbox = int(a["image_id"]), int(a["category_id"]), [float(v) for v in a["bbox"]]
            crowd = bool(a.get("iscrowd", 0))
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{where}: needs image_id, category_id and bbox [x, y, w, h]. Fix the file.") from None
        if image_id not in images:
            raise DataError(f"{where}: image_id {image_id} is not in 'images'. Fix the file.")
        if cat not in cat_index:
            raise DataError(f"{where}: category_id {cat} is not in 'categories' (ids: "
                            f"{', '.join(str(c) for c, _ in cats)}). Fix the file.")
        if len(bbox) != 4:
            raise DataError(f"{where}: bbox has {len(bbox)} numbers, not [x, y, w, h]. Fix the file.")
        x, y, w, h = bbox
        box = check_box([x, y, x + w, y + h], images[image_id][1], where)
        rows[image_id].append(box + [cat_index[cat], float(crowd)])
    anns = [Annotation(image_dir / f, size, _labels(rows[i]), f"{json_path}, image {i}")
            for i, (f, size) in images.items()]
    return anns, names


def coco_json(anns: Sequence[Annotation], class_names: Sequence[str]) -> dict[str, Any]:
    """A COCO instances dict; file names relative to the split's image folder, ids from 1."""
    images, annotations = [], []
    for i, ann in enumerate(anns, 1):
        images.append({"id": i, "file_name": ann.image.name, "width": ann.size[0], "height": ann.size[1]})
        for x0, y0, x1, y1, c, d in ann.labels.astype(np.float64).tolist():
            annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": int(c) + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                                "iscrowd": int(d)})
    return {"images": images, "annotations": annotations,
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(class_names)]}


def write_coco(root: Path, splits: Mapping[str, Sequence[Annotation]], class_names: Sequence[str]) -> None:
    """``root/annotations/instances_<split>.json`` and the images linked into ``root/<split>/``."""
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for split, anns in splits.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        for ann in anns:
            _place(ann.image, root / split / ann.image.name)
        _write(root / "annotations" / f"instances_{split}.json",
                   json.dumps(coco_json(anns, class_names)))


# ---------------------------------------------------------------- YOLO

def yolo_names(root: Path) -> list[str]:
    """Class names of a YOLO folder: ``data.yaml`` ``names`` (list, or dict of ids 0..n-1), else
    ``classes.txt`` (one per line)."""
    yml, txt = root / "data.yaml", root / "classes.txt"
    if yml.is_file():
        card = read_yaml(yml, DataError, "the YOLO card")
        names = card.get("names") if isinstance(card, dict) else None
        if isinstance(names, dict) and set(names) == set(range(len(names))):
            names = [names[i] for i in range(len(names))]
        if not (isinstance(names, list) and names):
            raise DataError(f"'{yml}' needs 'names': a list of class names, or a mapping 0: name, 1: name, ... "
                            f"with ids from 0 without gaps.")
        return [str(n) for n in names]
    if txt.is_file():
        names = [line.strip() for line in read_text(txt, DataError, "the class list").splitlines() if line.strip()]
        if names:
            return names
    raise DataError(f"YOLO folder '{root}' has no class names: add data.yaml with 'names: [cat, dog]' (or "
                    f"classes.txt, one name per line).")


def read_yolo_txt(txt: Path, image: Path, num_classes: int) -> Annotation:
    """One image's label file (absent: no objects)."""
    size = image_size(image)
    rows: list[list[float]] = []
    lines = read_text(txt, DataError, "the YOLO label file").splitlines() if txt.is_file() else []
    for n, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        where = f"{txt}, line {n}"
        if len(fields) != 5:
            raise DataError(f"{where}: expected 'class cx cy w h' (5 numbers), got {len(fields)}. Polygon "
                            f"(segmentation) labels are not supported; export boxes.")
        try:
            c, (cx, cy, w, h) = int(fields[0]), (float(v) for v in fields[1:])
        except ValueError:
            raise DataError(f"{where}: '{line.strip()}' is not 'class cx cy w h' with an integer class.") from None
        if not 0 <= c < num_classes:
            raise DataError(f"{where}: class id {c} is out of range; the dataset has {num_classes} classes "
                            f"(ids 0..{num_classes - 1}). Fix the label or data.yaml's names.")
        if size is None:
            continue  # the image is unreadable: the bad-image pass reports it
        W, H = size
        box = check_box([(cx - w / 2) * W, (cy - h / 2) * H, (cx + w / 2) * W, (cy + h / 2) * H], size, where)
        rows.append(box + [c, 0.0])
    return Annotation(image, size, _labels(rows), str(txt))


def images_in(folder: Path) -> list[Path]:
    """Image files directly in ``folder``, sorted, hidden ones ignored."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                  and p.suffix.lower() in IMAGE_EXTENSIONS)


def read_yolo(images: Path, labels: Path, num_classes: int) -> list[Annotation]:
    """Every image in ``images`` with its ``labels/<stem>.txt``."""
    return [read_yolo_txt(labels / f"{p.stem}.txt", p, num_classes) for p in images_in(images)]


def yolo_txt(ann: Annotation) -> str:
    w, h = ann.size
    out = []
    for x0, y0, x1, y1, c, _ in ann.labels.astype(np.float64).tolist():
        out.append(f"{int(c)} {(x0 + x1) / 2 / w:.8f} {(y0 + y1) / 2 / h:.8f} {(x1 - x0) / w:.8f} "
                   f"{(y1 - y0) / h:.8f}\n")
    return "".join(out)


def write_yolo(root: Path, splits: Mapping[str, Sequence[Annotation]], class_names: Sequence[str]) -> None:
    """``root/data.yaml``, ``root/images/<split>/`` (linked) and ``root/labels/<split>/*.txt``
    (``difficult`` has no place in YOLO files and is lost)."""
    for split, anns in splits.items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for ann in anns:
            _place(ann.image, root / "images" / split / ann.image.name)
            _write(root / "labels" / split / f"{ann.image.stem}.txt", yolo_txt(ann))
    card = {"path": ".", **{s: f"images/{s}" for s in splits}, "names": dict(enumerate(class_names))}
    _write(root / "data.yaml", yaml.safe_dump(card, sort_keys=False))
