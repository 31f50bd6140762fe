"""hvdps data: a data set written as TFRecord shards, for ``--dataset tfrecord`` under every method.

    hvdps data --dataset digits --shards 8 --out data/digits           # the bundled digits
    hvdps data --dataset mnist --data_dir ~/mnist --shards 16 --out data/mnist   # mnist.npz or IDX files
    hvdps data --dataset my_data.py:load --shards 64 --out data/mine    # your arrays (a data plug-in)
    hvdps data --dataset synthetic --layout imagenet --image_shape 224,224,3 --num_classes 1000 \
        --synthetic_samples 100000 --shards 128 --out data/imagenet     # tf_cnn_benchmarks' layout, any size
    hvdps data --dataset pysrc --seq_len 64 --shards 8 --out data/pysrc  # Python's standard library as text
    hvdps data --describe /data/imagenet                                # real ImageNet TFRecords: dataset.json
    hvdps compare --dataset tfrecord --data_dir data/digits ...         # then train from the files

The arrays are read and checked as training reads them (common/inputs/data.py), so the shards hold what
the in-memory run would train on; each split is cut into files of sizes differing by one at most,
with dataset.json beside them (common/inputs/records.py has the layouts). A synthetic set in the
imagenet layout is generated one record at a time, so it can be far larger than memory.

A set is written as a database writes a table: into a folder beside --out, renamed into place when every
shard and dataset.json are whole, under the lock a run folder takes. --out must be new or empty (nothing
of yours is replaced), a second writer is refused, the free space is checked against the set's size
before the first byte, and a writer killed midway leaves nothing a run would accept.
"""
import math
import os
import sys

from common.base.errors import UsageError, cli
from common.base.files import staged_folder
from common.base.procs import native_stderr_quiet
from common.base.flags import Parser, shape, size
from common.spec import builtins
from common.spec.config import Config, make_config
from common.inputs.records import (SPEC, check_free_space, describe_imagenet, estimated_bytes, write,
                                   write_synthetic_imagenet)
from common.spec.datasets import SYNTHETIC_TEST_SAMPLES
from common.inputs.data import input_spec, load_arrays



@cli
def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TensorFlow's C++ start-up chatter stays out
    d = Config()
    args = make_parser(d).parse_args(sys.argv[1:] if argv is None else argv)
    if (args.out is None) == (args.describe is None):
        raise UsageError("give --out (write a data set) or --describe DIR (describe ImageNet files already there)")
    if args.describe is not None:
        return describe(args)
    data = validate(args)
    args.layout = args.layout or ("text" if data and data.text else "plain")
    extra = {"image_shape": args.image_shape} if args.image_shape else {}
    classes = d.num_classes if args.num_classes is None else args.num_classes
    streamed = args.layout == "imagenet" and bool(data and data.shape_from_flags)   # generated record by record
    # the config checks the flags; a streamed set is never held, so its size is not the arrays' estimate
    cfg = make_config(dataset=args.dataset, data_dir=args.data_dir, seed=args.seed, num_classes=classes,
                      synthetic_samples=min(args.synthetic_samples, 8) if streamed else args.synthetic_samples,
                      seq_len=args.seq_len, model=language_model() if args.layout == "text" else d.model, **extra)
    image_format = args.image_format or ("jpeg" if streamed else "png")
    if os.path.lexists(os.path.join(args.out, SPEC)):
        raise UsageError(f"--out {args.out} already holds a data set ({SPEC}); choose another folder")
    with staged_folder(args.out, "--out", "a data set") as stage, native_stderr_quiet():   # renamed when whole
        if streamed:
            train, test = args.synthetic_samples, min(SYNTHETIC_TEST_SAMPLES, max(8, args.synthetic_samples // 4))
            check_free_space(stage, estimated_bytes(train + test, math.prod(cfg.image_shape), "imagenet",
                                                    image_format), f"--out {args.out}")
            write_synthetic_imagenet(stage, cfg.image_shape, cfg.num_classes, train, test, args.shards,
                                     args.test_shards, cfg.seed, image_format, args.resize)
        else:
            arrays = load_arrays(cfg)
            train, test = len(arrays[0]), len(arrays[2])
            check_free_space(stage, estimated_bytes(train + test, math.prod(arrays[0].shape[1:]), args.layout,
                                                    image_format), f"--out {args.out}")
            write(stage, arrays, input_spec(cfg)[1], args.shards, args.test_shards, args.layout, image_format)
    path = os.path.join(args.out, SPEC)
    print(f"{train} training and {test} test examples in {args.shards} + {args.test_shards} "
          f"TFRecord file(s), {args.layout} layout: {path}")
    model = f" --model {language_model()} --seq_len {args.seq_len}" if args.layout == "text" else ""
    print(f"train from them: hvdps compare --dataset tfrecord --data_dir {args.out}{model} ...")
    return 0


def language_model():
    """The built-in model that reads text (the one a text set is checked and trained for)."""
    return next(m.name for m in builtins.MODELS.values() if m.text)


def make_parser(d):
    """hvdps data's flags, ``d`` the config's defaults."""
    p = Parser(prog="hvdps data", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default=d.dataset,
                   help="digits, mnist, synthetic, or your own: module:function or file.py:function")
    p.add_argument("--data_dir", default=None, help="mnist: a folder with mnist.npz or the 4 MNIST IDX files")
    p.add_argument("--shards", type=int, default=8, help="files of the training split")
    p.add_argument("--test_shards", type=int, default=1, help="files of the test split")
    p.add_argument("--layout", default=None, choices=("plain", "imagenet", "text"),
                   help="plain (the default for arrays): raw feature bytes and a label; imagenet: encoded images "
                        "and 1-based labels, as tf_cnn_benchmarks reads; text (pysrc's, and its only one): each "
                        "sequence and the byte after it")
    p.add_argument("--image_format", default=None, choices=("jpeg", "png"),
                   help="the imagenet layout's encoding (png for arrays: lossless; jpeg for synthetic images)")
    p.add_argument("--resize", type=size, default=None,
                   help="synthetic imagenet layout: training resizes the --image_shape images to H,W")
    p.add_argument("--out", default=None, help="the folder the shards and dataset.json go to")
    p.add_argument("--describe", default=None, metavar="DIR",
                   help="write dataset.json for ImageNet TFRecords already in DIR (train-*, validation-*): their "
                        "images' size and labels read from the records; images of several sizes resized to "
                        "--image_shape (default 224,224,3)")
    p.add_argument("--seed", type=int, default=d.seed, help="synthetic data: the draw")
    p.add_argument("--image_shape", type=shape, default=None, help="synthetic data: H,W,C")
    p.add_argument("--num_classes", type=int, default=None, help=f"synthetic data (default {d.num_classes}); "
                   f"--describe: the classes (default: the largest label the records hold)")
    p.add_argument("--synthetic_samples", type=int, default=d.synthetic_samples, help="synthetic data: examples")
    p.add_argument("--seq_len", type=int, default=d.seq_len, help=f"text: bytes a sequence (default {d.seq_len}); "
                   f"training from the shards takes the same --seq_len")
    for name in ("shards", "test_shards"):
        p.bound(name, 1, 1 << 20)
    p.bound("synthetic_samples", 1, 1 << 40)
    return p


def validate(args):
    """The flags' rules between each other: the built-in data set named (None: a plug-in's arrays)."""
    if args.layout in (None, "plain", "text") and (args.image_format or args.resize):
        raise UsageError("--image_format and --resize are for --layout imagenet")
    data = builtins.DATA.get(args.dataset)          # None: a plug-in's arrays
    text = bool(data and data.text)
    if args.layout and (args.layout == "text") != text:
        texts = " or ".join(d.name for d in builtins.DATA.values() if d.text)
        raise UsageError(f"--layout {args.layout}: the text layout is for --dataset {texts}, and {texts} is written "
                         f"in the text layout only (its labels are a byte at every position)")
    generated = " or ".join(d.name for d in builtins.DATA.values() if d.shape_from_flags)
    if args.resize and not (data and data.shape_from_flags):
        raise UsageError(f"--resize is for a {generated} set (arrays are stored at their own size)")
    if args.layout == "imagenet" and args.image_shape and args.image_shape[2] not in (1, 3):
        raise UsageError(f"--image_shape {','.join(map(str, args.image_shape))}: the imagenet layout stores "
                         f"images of 1 or 3 channels")
    if data and not data.writable:
        writes = ", ".join(d.name for d in builtins.DATA.values() if d.writable)
        raise UsageError(f"--dataset {args.dataset}: hvdps data writes {writes} or a plug-in's arrays")
    return data


def describe(args):
    if not os.path.isdir(args.describe):
        raise UsageError(f"--describe {args.describe}: no such directory")
    shape, classes = args.image_shape, args.num_classes
    if shape is not None and (len(shape) != 3 or min(shape) < 1 or shape[2] not in (1, 3)):
        raise UsageError(f"--image_shape {','.join(map(str, shape))}: H,W,C with C 1 or 3")
    if classes is not None and not 1 <= classes <= 1 << 24:
        raise UsageError(f"--num_classes must be in [1, 16777216], got {classes}")
    path, spec = describe_imagenet(args.describe, shape, classes)
    size = "x".join(map(str, spec.shape))
    print(f"described: {path}: {sum(spec.train.records)} training and {sum(spec.test.records)} validation records, "
          f"{'resized to ' if spec.resize else ''}{size} images, {spec.classes} classes"
          f"{' (labels from 1)' if spec.first_label else ''}")
    print(f"train from them: hvdps compare --dataset tfrecord --data_dir {args.describe} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
