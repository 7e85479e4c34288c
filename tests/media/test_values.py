"""plait.Image, Audio and File as values: sources, format detection, caps, descriptions."""

from __future__ import annotations

import base64
import copy
import hashlib
import pickle
from pathlib import Path

import pytest

from plait import Audio, File, Image
from plait.backends.types import Message, message_from_dict, message_to_dict
from plait.errors import MediaError, PlaitError

from .samples import GIF, JPEG, MP3, PDF, WEBP, png, wav


@pytest.mark.parametrize(
    ("kind", "data", "media_type"),
    [
        (Image, png(), "image/png"),
        (Image, JPEG, "image/jpeg"),
        (Image, GIF, "image/gif"),
        (Image, WEBP, "image/webp"),
        (Audio, wav(), "audio/wav"),
        (Audio, MP3, "audio/mpeg"),
        (File, PDF, "application/pdf"),
        (File, "Invoice 42\nTotal: 12.50 €\n".encode(), "text/plain"),
    ],
)
def test_the_format_comes_from_the_bytes(kind, data, media_type):
    item = kind(data)
    assert item.media_type == media_type
    assert item.data == data and item.size == len(data)
    assert item.sha256 == hashlib.sha256(data).hexdigest()


def test_a_file_name_does_not_decide_the_format(tmp_path: Path):
    path = tmp_path / "photo.png"
    path.write_bytes(JPEG)
    image = Image(path)
    assert image.media_type == "image/jpeg" and image.name == "photo.png"
    assert Image(str(path)) == image


def test_bytes_of_another_kind_are_refused_naming_the_source(tmp_path: Path):
    path = tmp_path / "song.png"
    path.write_bytes(MP3)
    with pytest.raises(MediaError, match=r"Image from '.*song\.png': the bytes are not a PNG"):
        Image(path)
    with pytest.raises(MediaError, match="not WAV or MP3 audio"):
        Audio(png())
    with pytest.raises(MediaError, match="not a PDF or UTF-8 text document"):
        File(b"\x00\x01binary")


def test_a_missing_file_is_a_one_line_media_error(tmp_path: Path):
    with pytest.raises(MediaError, match=r"cannot read image file '.*nope\.png': No such file"):
        Image(tmp_path / "nope.png")
    with pytest.raises(MediaError, match=r"; check the path \(it is read from .*\), or give an "):
        Image("example.com/cat.jpg")  # a URL without its scheme is a path


def test_each_item_is_capped_and_the_error_names_the_input_and_the_cap(tmp_path: Path):
    big = png(64, 64)
    with pytest.raises(MediaError, match=r"Image from bytes is .* over the cap of 100 B per item"):
        Image(big, max_bytes=100)
    path = tmp_path / "scan.png"
    path.write_bytes(big)
    with pytest.raises(MediaError, match=r"image file '.*scan\.png' is .* over the cap of 100 B"):
        Image(path, max_bytes=100)
    assert Image(path, max_bytes=len(big)).size == len(big)


def test_the_default_cap_is_20_mib():
    with pytest.raises(MediaError, match=r"over the cap of 20\.0 MB per item"):
        File(b"a" * (20 * 1024 * 1024 + 1))


def test_a_data_uri_gives_the_same_image_as_its_bytes():
    data = png()
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    assert Image(uri) == Image(data)
    assert Image(data).data_uri() == uri
    with pytest.raises(MediaError, match="data:<type>;base64,<data>"):
        Image("data:image/png,raw")
    with pytest.raises(MediaError, match="not hold valid base64"):
        Image("data:image/png;base64,@@@")


def test_a_url_stays_a_url_and_is_never_fetched():
    image = Image("https://example.com/cat.jpg?token=secret", detail="high")
    assert image.url == "https://example.com/cat.jpg?token=secret" and image.data is None
    assert image.data_uri() == image.url
    assert "secret" not in repr(image)
    with pytest.raises(MediaError, match="is a URL; this provider needs the bytes"):
        image.base64()


def test_detail_is_checked():
    with pytest.raises(MediaError, match="detail must be 'auto', 'low' or 'high'"):
        Image(png(), detail="ultra")  # type: ignore[arg-type]


def test_values_are_immutable_equal_by_content_and_survive_pickle_and_copies():
    image = Image(png(), detail="low")
    assert image == Image(png(), detail="low") and hash(image) == hash(Image(png(), detail="low"))
    assert image != Image(png()) and image != Image(png(shade=9), detail="low")
    with pytest.raises(AttributeError):
        image.sha256 = "0" * 64  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(image))
    assert again == image and again.data == image.data and again.detail == "low"
    assert copy.deepcopy(image) is image


def test_reprs_describe_and_never_show_the_bytes():
    data = png(32, 32)
    image = Image(data)
    shown = repr(image)
    assert shown == f"<image image/png, {len(data)} B, {image.sha256[:12]}>"
    assert str(image) == shown
    assert base64.b64encode(data).decode()[:16] not in shown
    assert repr(File(PDF, name="report.pdf")).startswith("<file application/pdf, ")


def test_media_errors_are_plait_errors_and_value_errors():
    assert issubclass(MediaError, PlaitError) and issubclass(MediaError, ValueError)


def test_a_message_holds_text_and_media_in_order():
    image, clip = Image(png()), Audio(wav())
    message = Message("user", ["Compare", image, "with", clip])
    assert message.parts == ("Compare", image, "with", clip)
    assert message.media == (image, clip)
    assert message.content == "Compare\n\nwith"  # text readers see the text
    as_dict = message_to_dict(message)
    assert as_dict["content"] == [
        {"type": "text", "text": "Compare"},
        image,
        {"type": "text", "text": "with"},
        clip,
    ]
    assert message_from_dict(as_dict) == message


def test_a_text_only_message_has_no_parts():
    assert Message("user", "hi").parts == ()
    assert Message("user", ["a", "b"]) == Message("user", "a\n\nb")
    with pytest.raises(TypeError, match="part 1 of a message is int"):
        Message("user", ["a", 3])
