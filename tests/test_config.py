import json

import pytest

from common.spec.config import Config, build_parser, from_args, make_config
from common.formats.schemas import read_config as load
from common.base.errors import UsageError


def test_json_round_trip(tmp_path):
    cfg = make_config(model="cnn", batch_size=7, image_shape=(32, 32, 3), dataset="synthetic")
    path = cfg.save(str(tmp_path))
    again = load(path)
    assert again == cfg
    assert json.load(open(path))["image_shape"] == [32, 32, 3]


def test_frozen():
    cfg = make_config()
    with pytest.raises(Exception):
        cfg.batch_size = 3


def test_seed_flag_names_accepted(tmp_path):
    args = build_parser("t").parse_args(["--batch_size", "16", "--learning_rate", "0.1", "--train_steps", "9",
                                         "--hidden_units", "33", "--data_dir", str(tmp_path),
                                         "--train_dir", "x"])
    cfg = from_args(args)
    assert (cfg.batch_size, cfg.learning_rate, cfg.train_steps, cfg.hidden_units, cfg.train_dir) == \
           (16, 0.1, 9, 33, "x")
    assert cfg.data_dir == str(tmp_path)


@pytest.mark.parametrize("kw, message", [
    (dict(model="vgg"), "unknown model 'vgg' (valid: mlp, cnn, rec, transformer, resnet50, resnet101, inception_v3, vgg16, "
                        "mobilenet_v2, or module:function"),
    (dict(dataset="imagenet"), "valid: digits, mnist, synthetic, clicks"),
    (dict(batch_size=-1), "--batch_size must be positive"),
    (dict(learning_rate=0), "--learning_rate must be positive"),
    (dict(epochs=0, train_steps=0), "nothing to train"),
    (dict(dataset="mnist"), "needs --data_dir"),
    (dict(data_dir="/no/such/dir"), "no such directory"),
    (dict(model="resnet50"), "needs 3-channel images of at least 32x32"),
    (dict(model="resnet50", dataset="synthetic", image_shape=(8, 8, 3)), "at least 32,32,3"),
    (dict(target_accuracy=1.5), "--target_accuracy"),
    (dict(image_shape=(0, 2, 1)), "--image_shape"),
])
def test_bad_values_rejected(kw, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_config(**kw)


def test_unknown_json_key_rejected():
    with pytest.raises(UsageError, match="unknown config keys: bogus"):
        Config.from_dict({"bogus": 1})


def test_parser_error_is_usage_error():
    with pytest.raises(UsageError, match="invalid int value"):
        build_parser("t").parse_args(["--batch_size", "many"])
