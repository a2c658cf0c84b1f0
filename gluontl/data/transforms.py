"""Image decoding and the train/val transform pipeline, in numpy/cv2.

Transforms are our own numpy code rather than ``gluon.data.vision.transforms`` because the
random ones must draw from a generator we hand them: the loader seeds one generator per
sample from ``(seed, epoch, index)`` (see :func:`sample_rng`), so a sample's crop, flip and
jitter are the same whichever worker process computes it and however many workers there are.
Working on numpy arrays also keeps MXNet's engine out of forked DataLoader workers.

Pipeline, in this order (``train=False`` skips the random steps or replaces them with a
deterministic stand-in):

1. ``resize: N`` scales the *shorter side* to N, keeping the aspect ratio (the ImageNet
   evaluation convention pretrained models expect). With no crop configured, the centre
   N x N is then taken, so ``resize`` alone always yields N x N and batches stack.
2. ``random_resized_crop: S`` takes a random area in [8 %, 100 %], aspect in [3/4, 4/3] crop
   and resizes it to S x S (Inception style). Without ``train``: the centre S x S, after
   scaling the shorter side to S when no ``resize`` is set.
3. ``center_crop: C`` takes the centre C x C (scaling the shorter side up to C first if the
   image is smaller).
   Sizes are S (S x S) or [H, W] for a non-square model (``model.input_shape`` C, H, W): ``resize:
   [H, W]`` scales the image to cover H x W keeping its aspect ratio, then takes the centre H x W;
   ``random_resized_crop: [H, W]`` draws aspects around W/H.
4. ``flip`` mirrors left-right with probability 1/2 (train only).
5. ``color_jitter: f`` scales brightness, contrast and saturation by factors drawn from
   [1-f, 1+f], in random order (train only).
6. To a float32 CHW tensor in [0, 1], then ``normalize``: ``imagenet`` mean/std, ``none``, or
   ``((mean), (std))`` given as fractions of 255 like the ImageNet values.

Shrinking uses area interpolation (no aliasing), enlarging bilinear.

The deterministic form (:class:`Preprocess`: steps 1-3 and 6) is what evaluation, predict and
exports use; :func:`preprocess` is its public entry point, and its JSON record travels in every
export (ONNX ``metadata_props`` ``gluontl.preprocess``, ``NAME-preprocess.json``) so a model
can be fed from its file alone.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping, Union

import cv2
import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from ..deploy_preprocess import FORMAT as PREPROCESS_FORMAT, INTERPOLATION, VERSION as PREPROCESS_VERSION, \
    center_crop, make_record, resize_cover, resize_shorter, to_rgb
from ..errors import DataError, ModelSourceError
from ..readers import parse_json, read_json, shown
from ..recipe import TransformSpec, as_spec, size_hw
from .randaugment import rand_augment, random_erasing, trivial_augment
from ..runfolder import RunFolder

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)
_SAMPLE_TAG = 0x5A3E  # keeps per-sample streams apart from the loader's order stream


# ---------------------------------------------------------------- image files

# Pillow's own refusal (2 x Image.MAX_IMAGE_PIXELS: a 13,377 x 13,377 image), made ours: a library
# that lifts Pillow's global limit (or sets it to None) does not lift gluontl's.
MAX_IMAGE_PIXELS = 178_956_970


@contextlib.contextmanager
def open_image(source: str | Path | bytes | BinaryIO, name: str | None = None, what: str = "image",
               hint: str = "Replace or delete the file.") -> Iterator[Image.Image]:
    """The one door gluontl opens images and masks by: strict decoding (truncated files fail), at
    most ``MAX_IMAGE_PIXELS`` pixels (a decompression bomb is refused from its header, before any
    pixel is decoded), and every failure inside, decoding included, a DataError naming the file."""
    where = shown(name if name is not None else "<bytes>" if isinstance(source, bytes) else source)
    try:
        with _strict_decoding(), _open(source) as im:
            if (problem := _too_large(im)) is not None:
                raise DataError(f"Cannot read {what} '{where}': {problem}. {hint}")
            yield im
    except DataError:
        raise
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, struct.error, DecompressionBombError...)
        raise DataError(f"Cannot read {what} '{where}': {_reason(e)}. {hint}") from None


def _too_large(im: Image.Image) -> str | None:
    pixels = im.width * im.height
    return None if pixels <= MAX_IMAGE_PIXELS else \
        f"{im.width}x{im.height} is {pixels:,} pixels, over the {MAX_IMAGE_PIXELS:,} gluontl decodes (a " \
        f"decompression bomb, or an image far larger than a network's input: shrink it first)"


def _reason(e: Exception) -> str:
    if isinstance(e, Image.DecompressionBombError):
        return (f"too many pixels, over the {MAX_IMAGE_PIXELS:,} gluontl decodes ({e}; a decompression bomb, or "
                f"an image far larger than a network's input: shrink it first)")
    if isinstance(e, UnidentifiedImageError):
        return "not an image file (no known image format)"
    return f"corrupt or truncated image ({shown(str(e))})"


def image_problem(source: str | Path | bytes) -> str | None:
    """Why ``source`` (a path or encoded bytes) cannot be used as an image, or None.

    Fast enough to run over a whole split before training: PNG is checked by ``verify``
    (all chunk CRCs), JPEG is decoded at 1/8 scale (which still reads every byte, so
    truncation shows), anything else is decoded fully.
    """
    if (len(source) if isinstance(source, bytes) else Path(source).stat().st_size) == 0:
        return "empty file (0 bytes)"
    try:
        with _strict_decoding(), _open(source) as im:
            if (problem := _too_large(im)) is not None:
                return problem
            if im.format == "PNG":
                im.verify()
            else:
                if im.format == "JPEG":
                    im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, struct.error...)
        return _reason(e)
    return None


def decode_image(source: str | Path | bytes, name: str | None = None) -> np.ndarray:
    """Decode to HWC uint8 RGB whatever the file's mode.

    Grayscale, palette, RGBA/LA (alpha dropped), CMYK and 1-bit go through PIL's RGB
    conversion; 16-bit grayscale is scaled by 255/65535 (PIL's own conversion would clip it).
    EXIF orientation is applied so phone photos are upright.
    """
    with open_image(source, name, hint="Replace or delete the file (datasets are checked when loaded, so a file "
                                       "failing later was changed or removed since).") as im:
        return to_rgb(im)  # the deployable reference's decoding, so the two cannot drift apart


def load_image(path: str | Path) -> np.ndarray:
    """Read one image file as HWC uint8 RGB; a missing or unreadable file is a DataError."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"Image file '{p}' does not exist. Pass the path of an existing image.")
    problem = image_problem(p)
    if problem:
        raise DataError(f"Cannot read image '{p}': {problem}. Pass a JPEG, PNG, BMP, TIFF, GIF "
                        f"or WebP file.")
    return decode_image(p)


def load_images(images: list[str]) -> list[np.ndarray]:
    """Every file decoded up front, so a bad one fails before a model loads; a folder is refused."""
    for path in images:
        if Path(path).is_dir():
            raise DataError(f"'{path}' is a directory; pass image files (e.g. {Path(path) / '*.jpg'}).")
    return [load_image(path) for path in images]


@contextlib.contextmanager
def _strict_decoding() -> Iterator[None]:
    """Truncated files must fail: some libraries (gluoncv.data) switch PIL's global
    ``LOAD_TRUNCATED_IMAGES`` on at import, which would let them through silently."""
    old = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = old


def _open(source: str | Path | bytes | BinaryIO) -> Image.Image:
    return Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)


# ---------------------------------------------------------------- transforms

def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample's random transforms: a pure function of its identity."""
    return np.random.default_rng([_SAMPLE_TAG, seed % 2**64, epoch, index])


Step = tuple[str, Any]  # (op, size): resize_shorter S, resize_cover (H, W), center_crop, random_resized_crop


def _resize(size: int | tuple[int, int]) -> Step:
    """S: the shorter side to S; (H, W): scaled to cover H x W (the same step for H == W)."""
    return ("resize_shorter", size) if isinstance(size, int) else ("resize_cover", size)


def _steps(spec: TransformSpec, train: bool) -> tuple[Step, ...]:
    """The geometric steps of ``spec``; without ``train`` only deterministic ones (see module doc)."""
    steps: list[Step] = []
    if spec.resize:
        steps.append(_resize(spec.resize))
    if spec.random_resized_crop:
        if train:
            steps.append(("random_resized_crop", spec.random_resized_crop))
        else:
            if not spec.resize:
                steps.append(_resize(spec.random_resized_crop))
            steps.append(("center_crop", spec.random_resized_crop))
    if spec.center_crop:
        steps.append(("center_crop", spec.center_crop))
    elif spec.resize and not spec.random_resized_crop:
        steps.append(("center_crop", spec.resize))
    return tuple(steps)


_STEP_TEXT = {"resize_shorter": "shorter side to {0}", "resize_cover": "scaled to cover {0}x{1}",
              "center_crop": "centre crop {0}x{1}",
              "random_resized_crop": "random resized crop to {0}x{1} (area 8-100 %, aspect {2}-{3})"}


def _step_text(op: str, size: int | tuple[int, int]) -> str:
    h, w = size_hw(size)
    if op == "resize_shorter":
        return _STEP_TEXT[op].format(size)
    lo, hi = ("3/4", "4/3") if h == w else (f"{3 * w / (4 * h):.3g}", f"{4 * w / (3 * h):.3g}")
    return _STEP_TEXT[op].format(h, w, lo, hi)


def describe(spec: TransformSpec, train: bool) -> str:
    """The pipeline ``spec`` runs, in order, as the plan and the run card show it."""
    parts = [_step_text(op, size) for op, size in _steps(spec, train)]
    if train and spec.flip:
        parts.append("horizontal flip (p 1/2)")
    if train and (ra := spec.randaugment):
        parts.append(f"RandAugment n {ra.n} m {ra.m:g} mstd {ra.mstd:g} p {ra.p:g}")
    if train and spec.trivial_augment:
        parts.append("TrivialAugmentWide")
    if train and spec.color_jitter:
        parts.append(f"colour jitter {spec.color_jitter:g}")
    erasing = [f"random erasing p {e.prob:g} ({e.mode}, {e.count} box{'es' * (e.count > 1)})"
               for e in [spec.random_erasing] if train and e]
    return ", ".join([*parts, describe_normalize(spec), *erasing])


def describe_normalize(spec: TransformSpec) -> str:
    if isinstance(spec.normalize, str):
        return f"normalize {spec.normalize}"
    mean, std = spec.normalize
    text = f"normalize mean [{', '.join(f'{v:.4g}' for v in mean)}] std [{', '.join(f'{v:.4g}' for v in std)}]"
    if len(set(mean)) == 1 and len(set(std)) == 1:  # one value for every channel: say it in pixels
        text += f" = (pixel - {255 * mean[0]:.4g}) / {255 * std[0]:.4g}"
    return text


def _geometry(img: np.ndarray, steps: tuple[Step, ...], rng: np.random.Generator | None) -> np.ndarray:
    for op, size in steps:
        if op == "resize_shorter":
            img = _shorter_side(img, size)
        elif op == "resize_cover":
            img = resize_cover(img, size, resize_image)
        elif op == "center_crop":
            img = _center_crop(img, size)
        else:
            img = _random_resized_crop(img, size, rng)
    return img


@dataclass(frozen=True)
class Preprocess:
    """The deterministic pipeline that evaluation, predict and exported models use.

    It is what ``gluontl.preprocess`` runs and what every export records (``to_json``), so a
    model can be fed outside gluontl from its file alone. See :func:`preprocess`.
    """

    steps: tuple[Step, ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_spec(cls, spec: TransformSpec) -> "Preprocess":
        """The evaluation form of a recipe transform (random steps replaced, see module doc)."""
        mean, std = mean_std(spec)
        return cls(_steps(spec, False), tuple(mean), tuple(std))

    def __call__(self, img: np.ndarray) -> np.ndarray:
        return to_tensor(_geometry(img, self.steps, None).astype(np.float32), self.mean, self.std)

    def to_json(self, input_name: str, input_shape: tuple[int | None, ...]) -> dict[str, Any]:
        """The ``gluontl.preprocess`` record; ``input_shape`` is the model's, batch first (None:
        any batch size, JSON null)."""
        return make_record(input_name, input_shape, self.steps, self.mean, self.std)

    @classmethod
    def from_json(cls, record: Mapping[str, Any], where: str) -> "Preprocess":
        """Parse a ``gluontl.preprocess`` record; anything this version cannot reproduce is refused."""
        def bad(what: str) -> ModelSourceError:
            return ModelSourceError(f"The preprocessing record of {where} {what}; it was not written by this "
                                    f"gluontl version (format {PREPROCESS_FORMAT} version {PREPROCESS_VERSION}). "
                                    f"Re-export the model with this gluontl, or preprocess images yourself as "
                                    f"docs/export.md's 'Preprocessing' section describes.")

        if not isinstance(record, Mapping) or record.get("format") != PREPROCESS_FORMAT:
            raise bad("is not a gluontl preprocessing record (no \"format\": \"gluontl.preprocess\")")
        if record.get("version") != PREPROCESS_VERSION:
            raise bad(f"has version {record.get('version')!r}")
        fixed = {"color": "RGB", "scale": 255.0, "interpolation": INTERPOLATION}
        for key, want in fixed.items():
            if record.get(key) != want:
                raise bad(f"asks for {key} {record.get(key)!r} (supported: {want!r})")
        steps = []
        for step in record.get("steps", None) or []:
            size = step.get("size") if isinstance(step, Mapping) else None
            side = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0)
            two = isinstance(size, list) and len(size) == 2 and all(map(side, size))
            ok = isinstance(step, Mapping) and (
                (step.get("op") == "resize_shorter" and side(size))
                or (step.get("op") == "resize_cover" and two)
                or (step.get("op") == "center_crop" and (side(size) or two)))
            if not ok:
                raise bad(f"has a step {step!r} (supported: resize_shorter with a size > 0, resize_cover with "
                          f"[H, W], center_crop with a size or [H, W])")
            steps.append((step["op"], tuple(size) if two else size))
        mean, std = record.get("mean"), record.get("std")
        for name, values in (("mean", mean), ("std", std)):
            if not (isinstance(values, list) and len(values) == 3
                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
                raise bad(f"has {name} {values!r} (three numbers expected)")
        if min(std) <= 0:
            raise bad(f"has std {std!r} (values must be > 0)")
        return cls(tuple(steps), tuple(float(v) for v in mean), tuple(float(v) for v in std))


class Transform:
    """A built pipeline: ``t(img_hwc_uint8, rng) -> float32 CHW``.

    ``rng`` is needed only when ``random`` is true (training with crop/flip/jitter).
    """

    def __init__(self, spec: TransformSpec, train: bool) -> None:
        self.spec = spec
        self.train = train
        self.random = train and bool(spec.random_resized_crop or spec.flip or spec.color_jitter or spec.randaugment
                                     or spec.trivial_augment or spec.random_erasing)
        self.eval = Preprocess.from_spec(spec)
        self._steps = _steps(spec, train)

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        if not self.train:
            return self.eval(img)
        if self.random and rng is None:
            raise ValueError("this transform is random; pass rng=sample_rng(seed, epoch, index)")
        s = self.spec
        img = _geometry(img, self._steps, rng)
        if s.flip and rng.random() < 0.5:
            img = img[:, ::-1]
        if s.randaugment or s.trivial_augment:  # on 8-bit pixels, as timm's PIL ops (randaugment.py)
            fill = tuple(min(255, round(255 * v)) for v in self.eval.mean)
            if s.randaugment:
                img = rand_augment(np.ascontiguousarray(img), s.randaugment, rng, fill)
            if s.trivial_augment:
                img = trivial_augment(np.ascontiguousarray(img), rng, fill)
        img = img.astype(np.float32)
        if s.color_jitter:
            img = color_jitter_image(img, s.color_jitter, rng)
        x = to_tensor(img, self.eval.mean, self.eval.std)
        if e := s.random_erasing:  # on the normalised tensor, as timm's
            x = random_erasing(x, e.prob, e.mode, e.count, e.min_area, e.max_area, e.min_aspect, rng)
        return x


def build(spec: TransformSpec, train: bool) -> Transform:
    """The pipeline for ``spec``; ``train=False`` makes it deterministic (val, predict)."""
    return Transform(spec, train)


def to_tensor(img: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """HWC float32 pixels 0..255 -> normalised CHW float32, in the order docs/export.md documents."""
    chw = np.ascontiguousarray(img.transpose(2, 0, 1)) / np.float32(255.0)
    return (chw - np.array(mean, np.float32).reshape(3, 1, 1)) / np.array(std, np.float32).reshape(3, 1, 1)


# ---------------------------------------------------------------- preprocess()

ImageInput = Union[str, os.PathLike, bytes, np.ndarray]
SpecInput = Union[TransformSpec, Mapping[str, Any], str, os.PathLike]


def preprocess(image: ImageInput, spec: SpecInput) -> np.ndarray:
    """The CHW float32 tensor gluontl feeds a model for ``image`` (add ``[None]`` for a batch).

    Exactly what evaluation, ``gluontl predict`` and export verification compute: decode
    (EXIF orientation applied) -> 8-bit RGB (gray replicated, alpha dropped) -> the recorded
    steps (shorter-side resize with OpenCV's INTER_AREA when shrinking, INTER_LINEAR when
    enlarging; centre crop) -> ``(pixel / 255 - mean) / std`` in float32 -> CHW.

    ``image``: a file path, encoded bytes, or an HWC uint8 RGB (or HW gray) array.
    ``spec``: a recipe's ``TransformSpec`` or a dict of its keys (the evaluation form), a
    ``gluontl.preprocess`` record (dict), or where one is stored: an exported ``.onnx`` file (its metadata), a
    ``NAME-preprocess.json`` beside a symbol export, or a run folder (``preprocess.json``).
    """
    return load_preprocess(spec)[0](_as_rgb(image))


def load_preprocess(spec: SpecInput) -> tuple[Preprocess, list[str] | None]:
    """The pipeline ``spec`` describes and the class names stored with it (None if none are)."""
    if isinstance(spec, Mapping) and "format" not in spec and "preprocess" not in spec:
        spec = as_spec(spec, TransformSpec, "the transform", DataError, "{'resize': 256, 'center_crop': 224}",
                       "A transform takes the keys of a recipe's data.val_transform; a record from an export has "
                       "\"format\": \"gluontl.preprocess\".")
    if isinstance(spec, TransformSpec):
        return Preprocess.from_spec(spec), None
    if isinstance(spec, Mapping):
        record = spec.get("preprocess", spec)
        return Preprocess.from_json(record, "the given record"), _classes(spec.get("classes"), "the given record")
    path = Path(spec)
    if path.is_dir():
        path = RunFolder(path).card_path
    if path.suffix == ".onnx":
        return onnx_preprocess(path)
    if not path.is_file():
        raise ModelSourceError(f"'{path}' does not exist. Pass an exported .onnx file, a NAME-preprocess.json "
                               f"written beside a symbol export, or a run folder with {RunFolder.CARD}.")
    card = read_json(path, ModelSourceError, "the preprocessing record")
    if not isinstance(card, dict) or "preprocess" not in card:
        raise ModelSourceError(f"'{path}' has no \"preprocess\" entry; pass the NAME-preprocess.json of a "
                               f"gluontl export or a run folder's {RunFolder.CARD}.")
    return Preprocess.from_json(card["preprocess"], str(path)), _classes(card.get("classes"), str(path))


META_CLASSES = "gluontl.classes"
META_PREPROCESS = "gluontl.preprocess"
META_TASK = "gluontl.task"  # which task's predict reads the file; absent: classification


def model_card(spec: TransformSpec, classes: list[str], input_name: str,
               input_shape: tuple[int, ...]) -> dict[str, Any]:
    """What a run folder's ``preprocess.json`` and a symbol export's ``NAME-preprocess.json``
    hold: the evaluation pipeline of ``spec`` as a record for an input of C, H, W
    ``input_shape`` and any batch size, and the class names in label order."""
    return {"preprocess": Preprocess.from_spec(spec).to_json(input_name, (None, *input_shape)),
            "classes": list(classes)}


def onnx_props(card: Mapping[str, Any]) -> dict[str, str]:
    """A :func:`model_card` as the ONNX ``metadata_props`` an export carries (JSON strings)."""
    props = {META_CLASSES: json.dumps(card["classes"]), META_PREPROCESS: json.dumps(card["preprocess"])}
    return {**props, META_TASK: card["task"]} if "task" in card else props


def onnx_card(path: str | Path) -> dict[str, Any]:
    """The run card an exported ONNX file's metadata carries (``preprocess``, ``classes``), parsed;
    a file without it, or with text that is no JSON, is refused naming the file."""
    return card_of(onnx_metadata(path), path)


def card_of(meta: Mapping[str, str], path: str | Path) -> dict[str, Any]:
    """:func:`onnx_card` of an export's gluontl metadata (an ONNX file's, or an OpenVINO IR's runtime info)."""
    try:
        return {"preprocess": parse_json(meta[META_PREPROCESS]), "classes": parse_json(meta[META_CLASSES])}
    except ValueError as e:
        raise ModelSourceError(f"The metadata of '{path}' is not valid JSON ({e}); export the run again.") from None


def onnx_preprocess(path: str | Path) -> tuple[Preprocess, list[str]]:
    """The pipeline and class names an exported ONNX file's metadata_props record."""
    return preprocess_of(onnx_metadata(path), path)


def preprocess_of(meta: Mapping[str, str], path: str | Path) -> tuple[Preprocess, list[str]]:
    """The pipeline and class names of an export's gluontl metadata (ONNX metadata_props, or an
    OpenVINO IR's runtime info under the same keys)."""
    return (Preprocess.from_json(_json(meta[META_PREPROCESS], f"{path} ({META_PREPROCESS})"), str(path)),
            _class_list(_json(meta[META_CLASSES], f"{path} ({META_CLASSES})"), str(path)))


def onnx_metadata(path: str | Path) -> dict[str, str]:
    """The gluontl metadata_props of an ONNX file (both keys present, else a clear error)."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise ModelSourceError(f"ONNX file '{path}' does not exist; pass the .onnx file a gluontl export wrote.")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf has no single parse-error type
        raise ModelSourceError(f"'{path}' is not a readable ONNX file ({e}); re-export it.") from None
    meta = {p.key: p.value for p in model.metadata_props}
    missing = [k for k in (META_CLASSES, META_PREPROCESS) if k not in meta]
    if missing:
        raise ModelSourceError(f"'{path}' has no {' and no '.join(missing)} metadata, so its class names and "
                               f"preprocessing are unknown: it was not exported by gluontl from a run (or by an "
                               f"older version). Export the run with `gluontl export runs/NAME`, or predict with "
                               f"the run folder.")
    return meta


def _json(text: str, where: str) -> Any:
    try:
        return parse_json(text)
    except ValueError as e:
        raise ModelSourceError(f"{where} is not valid JSON ({e}); re-export the model.") from None


def _classes(value: Any, where: str) -> list[str] | None:
    return None if value is None else _class_list(value, where)


def _class_list(value: Any, where: str) -> list[str]:
    if not (isinstance(value, list) and value and all(isinstance(c, str) for c in value)):
        raise ModelSourceError(f"The class list of {where} is {value!r}, not a list of names; re-export the model.")
    return value


def _as_rgb(image: ImageInput) -> np.ndarray:
    if isinstance(image, bytes):
        return decode_image(image, "the given bytes")
    if not isinstance(image, np.ndarray):
        return load_image(image)
    if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise DataError(f"An image array must be HxWx3 RGB or HxW gray uint8, as decoded from a file; got "
                        f"{image.dtype} {image.shape}. Pass the file path to let gluontl decode it.")
    return np.repeat(image[:, :, None], 3, axis=2) if image.ndim == 2 else image


def mean_std(spec: TransformSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if spec.normalize == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    if spec.normalize == "none":
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    mean, std = spec.normalize
    if min(std) <= 0:
        raise DataError(f"normalize std {tuple(std)} has a value <= 0; give std as positive fractions "
                        f"of 255, e.g. normalize: [[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]].")
    return tuple(mean), tuple(std)


def resize_image(img: np.ndarray, w: int, h: int) -> np.ndarray:
    shrink = w * h < img.shape[0] * img.shape[1]
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def _shorter_side(img: np.ndarray, size: int) -> np.ndarray:
    return resize_shorter(img, size, resize_image)


def _center_crop(img: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    return center_crop(img, size, resize_image)


def _random_resized_crop(img: np.ndarray, size: int | tuple[int, int], rng: np.random.Generator,
                         scale: tuple[float, float] = (0.08, 1.0),
                         ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> np.ndarray:
    """Inception's crop; for an H x W output the aspect range is around W/H (torchvision's ratio is
    of the crop, which is then resized to the output: around the output's own shape, nothing is
    squeezed more than a square output squeezes it)."""
    th, tw = size_hw(size)
    if th != tw:
        ratio = (ratio[0] * tw / th, ratio[1] * tw / th)
    h, w = img.shape[:2]
    for _ in range(10):
        area = h * w * rng.uniform(*scale)
        aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1])))
        cw, ch = round(np.sqrt(area * aspect)), round(np.sqrt(area / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            return resize_image(img[y:y + ch, x:x + cw], tw, th)
    if th == tw:
        side = min(h, w)
        return resize_image(_center_crop(img, side), tw, th)
    ch, cw = (h, max(1, min(w, round(h * tw / th)))) if h * tw <= w * th else (max(1, min(h, round(w * th / tw))), w)
    return resize_image(_center_crop(img, (ch, cw)), tw, th)  # the largest centre crop of the output's shape


def luma(img: np.ndarray) -> np.ndarray:
    """Per-pixel luma of float32 HWC pixels, ``(r * 0.299 + g * 0.587) + b * 0.114`` rounded in float32
    step by step: elementwise ufuncs round the same everywhere, where ``img @ _LUMA`` is a BLAS
    gemv whose kernel (and its use of FMA) depends on the OpenBLAS build and the CPU."""
    return img[..., 0] * _LUMA[0] + img[..., 1] * _LUMA[1] + img[..., 2] * _LUMA[2]


def mean_f32(a: np.ndarray) -> np.float32:
    """The mean of a float32 array, summed in float64 by halving (``s[:h] + s[h:]`` until one value
    is left) and rounded once to float32.

    ``a.mean()`` sums float32 pairwise in blocks whose unrolling changed between numpy 1.23 and
    2.x, so a 224x224 image's mean luma could differ in its last bit (and every jittered pixel
    after it). Elementwise adds round the same on every numpy and CPU, so the order here is this
    code's, not numpy's (a sequential ``add.accumulate`` would be too, but 10x slower)."""
    s = np.ascontiguousarray(a, np.float64).reshape(-1)
    n = s.size
    while s.size > 1:
        if s.size % 2:
            s = np.append(s, 0.0)  # + 0.0 is exact
        h = s.size // 2
        s = s[:h] + s[h:]
    return np.float32(s[0] / n)


def color_jitter_image(img: np.ndarray, f: float, rng: np.random.Generator) -> np.ndarray:
    factors = rng.uniform(1 - f, 1 + f, size=3)
    for op in rng.permutation(3):
        a = np.float32(factors[op])
        if op == 0:  # brightness
            img = img * a
        elif op == 1:  # contrast: towards the mean luma
            m = mean_f32(luma(img))
            img = (img - m) * a + m
        else:  # saturation: towards each pixel's luma
            g = luma(img)[:, :, None]
            img = (img - g) * a + g
        img = np.clip(img, 0, 255)
    return img
