"""Media through programs: signatures, forward, tracing, cache, checkpoints, backends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest

from plait import (
    Image,
    InputField,
    LLMInference,
    Module,
    OutputField,
    Predict,
    ResourceConfig,
    ResourceManager,
    Signature,
    run,
)
from plait.backends.base import Backend
from plait.backends.types import Request, Response
from plait.errors import MediaError
from plait.execution.checkpoint import CheckpointError
from plait.resources.usage import Budget, budgeted
from plait.testing import ScriptedServer

from .samples import PDF, png


class ReadTotal(Signature):
    """Read the total of the invoice."""

    scan: Image = InputField(description="the invoice")
    currency: str = InputField()
    total: float = OutputField()


async def test_a_signature_image_field_is_a_content_part_not_text():
    scan = Image(png())
    async with ScriptedServer(responder=lambda body: json.dumps({"total": 12.5})) as server:
        predict = Predict(ReadTotal, alias="llm")
        config = {"llm": server.endpoint()}
        result = await run(predict, scan=scan, currency="EUR", resources=config)
    assert result.total == 12.5
    user = server.stats.log[0].body["messages"][-1]
    assert user == {
        "role": "user",
        "content": [
            {"type": "text", "text": "scan: "},
            {"type": "image_url", "image_url": {"url": scan.data_uri()}},
            {"type": "text", "text": "\ncurrency: EUR"},
        ],
    }


class Compare(Module):
    """Passes two images and a document through forward to one call, and returns one."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm")

    def forward(self, first: Image, second: Image, terms) -> dict:
        return {"kept": first, "answer": self.llm(["Which matches?", first, second, terms])}


async def test_a_forward_passes_media_through_tracing_as_values():
    from plait import File

    first, second, terms = Image(png()), Image(png(shade=7)), File(PDF)
    async with ScriptedServer() as server:
        out = await run(Compare(), first, second, terms, resources={"llm": server.endpoint()})
    assert out["kept"] is first
    content = server.stats.log[0].body["messages"][0]["content"]
    assert [part["type"] for part in content] == ["text", "image_url", "image_url", "file"]


async def test_the_cache_answers_the_same_image_and_not_another(tmp_path: Path):
    async with ScriptedServer() as server:
        config = {"llm": {**server.endpoint(), "cache": str(tmp_path / "cache.db")}}
        async with ResourceManager(config) as manager:
            program = LLMInference("llm")
            await run(program, ["What is it?", Image(png())], resources=manager)
            await run(program, ["What is it?", Image(png())], resources=manager)  # same bytes
            await run(program, ["What is it?", Image(png(), detail="low")], resources=manager)
            await run(program, ["What is it?", Image(png(shade=3))], resources=manager)
    assert server.stats.requests == 3


class Keep(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm")

    def forward(self, image: Image) -> dict:
        return {"image": image, "answer": self.llm(["Describe", image])}


async def test_a_checkpoint_keeps_media_as_blobs_and_restores_them(tmp_path: Path):
    images = [Image(png(shade=i), detail="high") for i in range(3)]
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint()}
        first = await run(Keep(), images, resources=config, checkpoint_dir=tmp_path)
        server.reset_stats()
        again = await run(Keep(), images, resources=config, checkpoint_dir=tmp_path)
        assert server.stats.requests == 0
    assert again == first and [o["image"] for o in again] == images
    assert again[0]["image"].data == images[0].data and again[0]["image"].detail == "high"
    blobs = sorted(p.name for p in (tmp_path / "blobs").iterdir())
    assert blobs == sorted(image.sha256 for image in images)
    lines = (tmp_path / "items.jsonl").read_text()
    assert "base64" not in lines and "iVBOR" not in lines  # never the bytes in a line


def tamper(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new, 1))


@pytest.mark.parametrize("name", ["../../outside", "/etc/passwd", "ABC"])
async def test_a_line_naming_a_blob_outside_the_folder_is_refused(tmp_path: Path, name: str):
    image = Image(png())
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint()}
        await run(Keep(), [image], resources=config, checkpoint_dir=tmp_path)
        tamper(tmp_path / "items.jsonl", image.sha256, name)
        with pytest.raises(CheckpointError, match=r"items\.jsonl:1: .*not a hex SHA-256"):
            await run(Keep(), [image], resources=config, checkpoint_dir=tmp_path)


async def test_a_changed_or_missing_blob_is_refused(tmp_path: Path):
    image = Image(png())
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint()}
        await run(Keep(), [image], resources=config, checkpoint_dir=tmp_path)
        blob = tmp_path / "blobs" / image.sha256
        blob.write_bytes(png(shade=200))
        with pytest.raises(CheckpointError, match="was changed since it was written"):
            await run(Keep(), [image], resources=config, checkpoint_dir=tmp_path)
        blob.unlink()
        with pytest.raises(CheckpointError, match=r"media blob .* is missing"):
            await run(Keep(), [image], resources=config, checkpoint_dir=tmp_path)


class Seen(Backend):
    """A user's provider: records the neutral requests it receives."""

    requests: ClassVar[list[Request]] = []

    async def complete(self, request: Request) -> Response:
        Seen.requests.append(request)
        return Response(text=f"{len(request.messages[-1].media)} media", finish_reason="stop")


async def test_a_user_backend_receives_media_in_the_neutral_request():
    image, other = Image(png()), Image("https://example.com/x.png")
    program = LLMInference("llm").bind(ResourceConfig({"llm": {"provider": Seen}}))
    assert await program(["Compare", image, "and", other]) == "2 media"
    (request,) = Seen.requests
    assert request.messages[-1].parts == ("Compare", image, "and", other)


async def test_the_embedded_model_refuses_media_naming_the_alias():
    config = {"reader": {"provider": "local"}}
    pattern = r"alias 'reader': LocalBackend\(.*\) is a text-only model and cannot take <image"
    with pytest.raises(MediaError, match=pattern):
        await run(LLMInference("reader"), ["What is it?", Image(png())], resources=config)


async def test_a_call_refused_for_its_media_is_not_counted_as_a_request_nor_spent():
    config = ResourceConfig({"reader": {"provider": "local"}})
    with budgeted(Budget(max_calls=1)) as budget, pytest.raises(MediaError):
        await run(LLMInference("reader"), ["What is it?", Image(png())], resources=config)
    assert ResourceManager.shared(config).stats()["reader"].requests == 0
    assert budget is not None
    assert budget.spent()["calls"] == 0  # the next call still has room


async def test_reports_and_callbacks_show_a_description_not_the_bytes(tmp_path: Path):
    image = Image(png(16, 16))
    async with ScriptedServer() as server:
        _, report = await run(
            LLMInference("llm"), ["Describe", image], resources={"llm": server.endpoint()},
            report=True,
        )  # fmt: skip
    saved = tmp_path / "run.json"
    report.save(saved)
    text = saved.read_text()
    assert image.data_uri()[22:60] not in text


async def test_spans_show_a_mediums_kind_size_and_hash_never_its_bytes():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import plait
    from plait.report.telemetry import OpenTelemetryCallback

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    scan = Image(png())
    callback = OpenTelemetryCallback(provider, capture_content=True)
    async with ScriptedServer(responder=lambda body: json.dumps({"total": 12.5})) as server:
        with plait.settings.context(callbacks=[callback]):
            await run(Predict(ReadTotal, alias="llm"), scan=scan, currency="EUR",
                      resources={"llm": server.endpoint()})  # fmt: skip
    (span,) = [s for s in exporter.get_finished_spans() if "plait.module.inputs" in s.attributes]
    shown = json.loads(span.attributes["plait.module.inputs"])["inputs"]["scan"]
    assert shown["kind"] == "image" and shown["size"] == len(scan.data or b"")
    assert shown["sha256"] == scan.sha256 and shown["media_type"] == "image/png"
    assert scan.base64()[:40] not in json.dumps(
        [dict(s.attributes) for s in exporter.get_finished_spans()]
    )
