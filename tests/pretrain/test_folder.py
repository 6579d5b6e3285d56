"""Image-folder batches: scanning, shapes, one pass per epoch, determinism, decoding and every error."""

import itertools

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import transforms

from pretrain.folder import IMG_EXTENSIONS, FolderConfig, FolderError, FolderSource, load_image

SIZE = 16  # px
SIZES = [(40, 30), (25, 50), (64, 64), (33, 47), (120, 18)]  # (w, h), landscape, portrait, square, extreme
# 18 colours at least 100 apart in some channel, so an image is known by its mean colour even after JPEG
COLOURS = [np.array(c, np.uint8) for c in itertools.product((20, 120, 220), (20, 120, 220), (20, 220))]


def _save(path, colour, wh):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", wh, tuple(int(c) for c in colour)).save(path, quality=95)


@pytest.fixture
def labelled(tmp_path):
    """3 classes x 5 solid-colour images (png and jpg, varied sizes); (root, {colour index: class index})."""
    tmp_path = tmp_path / "labelled"
    owner = {}
    for c, name in enumerate(["cat", "dog", "eel"]):
        for k in range(5):
            i = 5 * c + k
            ext = ".png" if k % 2 else ".jpg"
            _save(tmp_path / name / f"im{k}{ext}", COLOURS[i], SIZES[k])
            owner[i] = c
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    _save(tmp_path / "stray.png", COLOURS[17], (20, 20))  # files directly in ROOT are not in any class
    return tmp_path, owner


@pytest.fixture
def unlabelled(tmp_path):
    """7 images, two of them in nested folders and one with an upper-case extension, plus a non-image."""
    tmp_path = tmp_path / "unlabelled"
    names = ["a.png", "b.jpg", "c.JPEG", "sub/d.png", "sub/deeper/e.jpg", "f.bmp", "g.webp"]
    for i, name in enumerate(names):
        _save(tmp_path / name, COLOURS[i], SIZES[i % len(SIZES)])
    (tmp_path / "readme.md").write_text("#")
    return tmp_path


def _identify(images):
    """(1, B, S, S, 3) solid-colour images -> index of the nearest colour of each."""
    means = images[0].float().mean(dim=(1, 2))  # (B, 3)
    palette = torch.tensor(np.stack(COLOURS), dtype=torch.float32)
    dist, idx = torch.cdist(means, palette).min(dim=1)
    assert (dist < 10).all(), dist  # each image is close to exactly one colour: nothing was mixed up
    return idx.tolist()


def _all(source, epoch=0):
    return list(source.batches(epoch))


def test_extensions_match_torchvision():
    assert IMG_EXTENSIONS == torchvision.datasets.folder.IMG_EXTENSIONS


def test_scan_matches_torchvision_image_folder(labelled):
    root, _ = labelled
    source = FolderSource(FolderConfig(str(root), SIZE, batch_size=4, labelled=True))
    reference = torchvision.datasets.ImageFolder(str(root))
    assert source.classes == reference.classes == ["cat", "dog", "eel"]
    assert source.n_images == 15
    paths = [source.dataset.path(i) for i in range(source.n_images)]
    assert list(zip(paths, source.dataset.labels.tolist(), strict=True)) == reference.samples


def test_shapes_and_dtypes(labelled, unlabelled):
    source = FolderSource(FolderConfig(str(labelled[0]), SIZE, batch_size=4, labelled=True))
    batches = _all(source)
    assert len(source) == len(batches) == 3  # 15 images, drop_last
    for b in batches:
        assert b["images"].shape == (1, 4, SIZE, SIZE, 3) and b["images"].dtype == torch.uint8
        assert b["labels"].shape == (4,) and b["labels"].dtype == torch.int64
    plain = FolderSource(FolderConfig(str(unlabelled), SIZE, batch_size=3))
    assert plain.classes == [] and plain.n_images == 7 and len(plain) == 2
    assert all(set(b) == {"images"} for b in _all(plain))


def test_every_image_once_per_epoch_with_its_label(labelled):
    root, owner = labelled
    source = FolderSource(FolderConfig(str(root), SIZE, batch_size=4, labelled=True, drop_last=False))
    batches = _all(source, epoch=3)
    assert len(source) == len(batches) == 4 and [len(b["labels"]) for b in batches] == [4, 4, 4, 3]
    seen = [i for b in batches for i in _identify(b["images"])]
    assert sorted(seen) == sorted(owner)  # all 15, each once, and not the stray image in ROOT
    labels = [lab for b in batches for lab in b["labels"].tolist()]
    assert labels == [owner[i] for i in seen]


def test_unlabelled_finds_nested_images_once(unlabelled):
    source = FolderSource(FolderConfig(str(unlabelled), SIZE, batch_size=2, drop_last=False))
    seen = [i for b in _all(source) for i in _identify(b["images"])]
    assert sorted(seen) == list(range(7))


def test_seed_and_epoch_fix_the_batches_whatever_the_workers(labelled):
    cfg = FolderConfig(str(labelled[0]), SIZE, batch_size=4, labelled=True, seed=5)
    a, b = _all(FolderSource(cfg), epoch=2), _all(FolderSource(cfg, workers=2), epoch=2)
    assert len(a) == len(b) == 3
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["images"], y["images"]) and torch.equal(x["labels"], y["labels"])
    order = [i for x in a for i in _identify(x["images"])]
    other_epoch = [i for x in _all(FolderSource(cfg), epoch=3) for i in _identify(x["images"])]
    other_seed = [i for x in _all(FolderSource(FolderConfig(**{**cfg.__dict__, "seed": 6})), epoch=2)
                  for i in _identify(x["images"])]
    assert order != other_epoch and order != other_seed


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_shares_of_an_epoch_are_disjoint_cover_it_and_keep_its_batches(labelled, world):
    cfg = FolderConfig(str(labelled[0]), SIZE, batch_size=6, labelled=True, seed=1)
    whole = FolderSource(cfg).order(4)
    shares = []
    for rank in range(world):
        source = FolderSource(cfg)
        source.shard = (rank, world)
        shares.append(source.my_order(4))
    assert all(len(s) == len(whole) == 2 and all(len(b) == 6 // world for b in s) for s in shares)
    for k, batch in enumerate(whole):  # batch k of rank 0, 1, ... in rank order is the one-process batch k
        assert [i for share in shares for i in share[k]] == batch
    seen = [i for share in shares for b in share for i in b]
    assert len(seen) == len(set(seen)) == 12  # disjoint; with drop_last the 2 whole batches of 15 images
    source.shard = (world - 1, world)  # and the decoded batches are those rows
    decoded = [_identify(b["images"]) for b in _all(source, epoch=4)]
    assert decoded == [_identify(b["images"])[-(6 // world):] for b in _all(FolderSource(cfg), epoch=4)]


def test_centre_crop_of_a_wide_and_a_tall_image(tmp_path):
    wide = np.zeros((30, 90, 3), np.uint8)  # (H, W, 3): red | green | blue columns, 30 px each
    wide[:, :30, 0], wide[:, 30:60, 1], wide[:, 60:, 2] = 255, 255, 255
    Image.fromarray(wide).save(tmp_path / "wide.png")
    Image.fromarray(wide.transpose(1, 0, 2).copy()).save(tmp_path / "tall.png")  # red / green / blue rows
    green = np.array([0, 255, 0])
    for name in ("wide", "tall"):
        out = load_image(str(tmp_path / f"{name}.png"), 15)  # 90x30 -> 45x15 -> columns 15..30, all green
        assert out.shape == (15, 15, 3) and out.dtype == np.uint8
        assert np.abs(out[2:-2, 2:-2].astype(int) - green).max() <= 2, name


def test_half_red_half_blue_stays_so(tmp_path):
    img = np.zeros((40, 60, 3), np.uint8)  # 60 wide: the 40x40 centre crop keeps 20 px of each half
    img[:, :30, 0], img[:, 30:, 2] = 255, 255
    Image.fromarray(img).save(tmp_path / "rb.png")
    out = load_image(str(tmp_path / "rb.png"), 20).astype(int)
    assert (np.abs(out[:, :8] - [255, 0, 0]).max(), np.abs(out[:, 12:] - [0, 0, 255]).max()) == (0, 0)


def test_decoding_matches_torchvision_resize_and_centre_crop(tmp_path):
    rng = np.random.default_rng(0)
    reference = transforms.Compose([transforms.Resize(SIZE), transforms.CenterCrop(SIZE)])
    for k, (w, h) in enumerate(SIZES):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{k}.png")
        Image.fromarray(pixels).convert("L").save(tmp_path / f"{k}g.png")  # grey: converted to RGB
        for name in (f"{k}.png", f"{k}g.png"):
            with Image.open(tmp_path / name) as im:
                want = np.asarray(reference(im.convert("RGB")))
            np.testing.assert_array_equal(load_image(str(tmp_path / name), SIZE), want)


def test_jpeg_draft_decoding_is_close_to_full_decoding(tmp_path):
    y, x = np.mgrid[0:200, 0:300]  # smooth image, large enough for a 1/4-scale JPEG draft
    pixels = np.stack([x * 255 // 300, y * 255 // 200, (x + y) * 255 // 500], axis=-1).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "big.jpg", quality=95)
    with Image.open(tmp_path / "big.jpg") as im:
        want = np.asarray(transforms.CenterCrop(SIZE)(transforms.Resize(SIZE)(im.convert("RGB")))).astype(int)
    got = load_image(str(tmp_path / "big.jpg"), SIZE).astype(int)
    assert np.abs(got - want).mean() < 2 and np.abs(got - want).max() < 12


def _error(cfg, workers=0):
    with pytest.raises(FolderError) as info:
        _all(FolderSource(cfg, workers))
    message = str(info.value)
    assert "\n" not in message and message
    return message


def test_missing_or_non_directory_root(tmp_path):
    assert "does not exist" in _error(FolderConfig(str(tmp_path / "nope"), SIZE))
    (tmp_path / "file.png").write_bytes(b"")
    assert "not a directory" in _error(FolderConfig(str(tmp_path / "file.png"), SIZE))


def test_no_images_names_the_accepted_extensions(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.gif").write_bytes(b"GIF89a")
    message = _error(FolderConfig(str(tmp_path), SIZE))
    assert "no images" in message and all(ext in message for ext in IMG_EXTENSIONS)


def test_labelled_needs_two_classes_each_with_images(tmp_path):
    _save(tmp_path / "only" / "a.png", COLOURS[0], (8, 8))
    cfg = FolderConfig(str(tmp_path), SIZE, batch_size=1, labelled=True)
    assert "at least 2 class folders" in _error(cfg)
    (tmp_path / "empty").mkdir()
    assert "without images" in _error(cfg) and "empty" in _error(cfg)


def test_fewer_images_than_a_batch(unlabelled):
    assert "--batch-size" in _error(FolderConfig(str(unlabelled), SIZE, batch_size=8))
    source = FolderSource(FolderConfig(str(unlabelled), SIZE, batch_size=8, drop_last=False))
    assert len(source) == 1 and _all(source)[0]["images"].shape == (1, 7, SIZE, SIZE, 3)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["garbage", "truncated"])
def test_unreadable_image_names_the_file(unlabelled, kind, workers):
    bad = unlabelled / "sub" / "zz_bad.jpg"
    if kind == "garbage":
        bad.write_bytes(b"this is not a jpeg")
    else:
        _save(bad, COLOURS[9], (64, 64))
        bad.write_bytes(bad.read_bytes()[:200])
    assert "zz_bad.jpg" in _error(FolderConfig(str(unlabelled), SIZE, batch_size=8), workers)


def test_invalid_config():
    with pytest.raises(FolderError):
        FolderConfig("x", 0)
    with pytest.raises(FolderError):
        FolderConfig("x", SIZE, batch_size=0)
