"""Checkpoints under hostile files: nothing in the directory chooses code, links are not
followed, outputs come back as what they were, and changed prompts are never mixed in."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from plait import LLMInference, Module, ResourceConfig, ResourceManager, run
from plait.execution.checkpoint import CheckpointError, CheckpointMismatchError
from plait.testing import ScriptedServer

from .support import endpoint

ITEMS = ["a", "b", "c"]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
async def manager(server: ScriptedServer) -> AsyncIterator[ResourceManager]:
    async with ResourceManager({"llm": endpoint(server)}) as running:
        yield running


def records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "items.jsonl").read_text().splitlines()]


def rewrite(directory: Path, edit) -> None:
    lines = records(directory)
    edit(lines)
    (directory / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


# ------------------------------------------------------------- code execution
@pytest.mark.parametrize(
    "attack",
    [
        {"shape": {"type": "subprocess:run"}},
        {"shape": {"mapping": "subprocess:Popen", "items": {}}},
        {"shape": {"list": [{"type": "os:system"}]}, "output": ["touch {pwned}"]},
        {"type": "subprocess:run"},  # the key an earlier plait imported by name
    ],
)
async def test_an_edited_checkpoint_line_never_imports_or_calls_what_it_names(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path, attack: dict[str, Any]
) -> None:
    pwned = tmp_path / "PWNED"
    checkpoint = tmp_path / "checkpoint"
    program = LLMInference("llm", temperature=0.0)
    await run(program, ITEMS, resources=manager, checkpoint_dir=checkpoint)

    payload = {"args": f"touch {pwned}", "shell": True}

    def plant(lines: list[dict[str, Any]]) -> None:
        lines[1].update(
            {"output": payload, **json.loads(json.dumps(attack).replace("{pwned}", str(pwned)))}
        )

    rewrite(checkpoint, plant)
    if "shape" in attack:
        with pytest.raises(CheckpointError, match=r"items\.jsonl:2: .*does not declare"):
            await run(program, ITEMS, resources=manager, checkpoint_dir=checkpoint)
    else:  # no shape: the line is plain JSON data, returned as data
        outputs = await run(program, ITEMS, resources=manager, checkpoint_dir=checkpoint)
        assert outputs[1] == payload
    assert not pwned.exists()
    assert server.stats.requests == 3  # only the first run asked anything


async def test_symlinks_planted_in_the_checkpoint_directory_are_refused_or_replaced(
    manager: ResourceManager, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    program = LLMInference("llm", temperature=0.0)

    linked_items = tmp_path / "items-link"
    linked_items.mkdir()
    (linked_items / "items.jsonl").symlink_to(victim)
    with pytest.raises(CheckpointError, match="symbolic link"):
        await run(program, ITEMS, resources=manager, checkpoint_dir=linked_items)

    linked_tmp = tmp_path / "tmp-link"
    linked_tmp.mkdir()
    (linked_tmp / "manifest.tmp").symlink_to(victim)  # the temporary name plait once used
    await run(program, ITEMS, resources=manager, checkpoint_dir=linked_tmp)
    assert json.loads((linked_tmp / "manifest.json").read_text())["items"] == 3

    linked_manifest = tmp_path / "manifest-link"
    linked_manifest.mkdir()
    (linked_manifest / "manifest.json").symlink_to(victim)
    with pytest.raises(CheckpointError, match="symbolic link"):
        await run(program, ITEMS, resources=manager, checkpoint_dir=linked_manifest)

    assert victim.read_text() == "precious\n"


async def test_a_fifo_or_a_file_where_a_directory_belongs_gives_a_clear_error(
    manager: ResourceManager, tmp_path: Path
) -> None:
    program = LLMInference("llm")
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        await run(program, ITEMS, resources=manager, checkpoint_dir=a_file)

    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "items.jsonl")
    with pytest.raises(CheckpointError, match="not a regular file"):
        await run(program, ITEMS, resources=manager, checkpoint_dir=fifo_dir)


# ------------------------------------------------------------- hostile sizes
async def test_a_large_junk_tail_is_read_line_by_line_not_whole(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    program = LLMInference("llm", temperature=0.0)
    first = await run(program, ITEMS, resources=manager, checkpoint_dir=tmp_path)
    junk = 48 * 1024 * 1024
    with open(tmp_path / "items.jsonl", "ab") as file:
        file.write(b"x" * junk)  # one line, no newline: what a torn write or an attacker leaves
    tracemalloc.start()
    try:
        resumed = await run(program, ITEMS, resources=manager, checkpoint_dir=tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert resumed == first and server.stats.requests == 3  # every item came from disk
    assert peak < junk / 3, f"resuming held {peak / 2**20:.0f} MB of a {junk / 2**20:.0f} MB file"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("field", ["output", "shape"], ids=["deep-output", "deep-shape"])
async def test_deeply_nested_json_in_a_line_is_a_checkpoint_error_naming_file_and_line(
    manager: ResourceManager, tmp_path: Path, field: str
) -> None:
    program = LLMInference("llm", temperature=0.0)
    await run(program, ITEMS, resources=manager, checkpoint_dir=tmp_path)
    lines = (tmp_path / "items.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    if field == "output":
        lines[1] = lines[1].replace('"output": ', f'"output": {nested(100_000)}, "was": ', 1)
    else:  # shallow enough for the JSON parser, too deep to restore
        shape = '{"list": [' * 400 + "null" + "]}" * 400
        lines[1] = json.dumps({**record, "output": None}).replace(
            '"output": null', f'"shape": {shape}, "output": {"[" * 400}null{"]" * 400}', 1
        )
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match=r"items\.jsonl:2: .*nested too deeply"):
        await run(program, ITEMS, resources=manager, checkpoint_dir=tmp_path)


async def test_a_deeply_nested_manifest_is_a_checkpoint_error_naming_the_file(
    manager: ResourceManager, tmp_path: Path
) -> None:
    (tmp_path / "manifest.json").write_text(f'{{"format": 2, "program": {nested(100_000)}}}')
    with pytest.raises(CheckpointError, match=r"manifest\.json is nested too deeply"):
        await run(LLMInference("llm"), ITEMS, resources=manager, checkpoint_dir=tmp_path)


# ------------------------------------------------------------- faithful outputs
@dataclass
class Tagged:
    text: str
    count: int


class Verdict(BaseModel):
    label: str
    score: float


class Tag(Module):
    """An async leaf whose output type is declared by its return annotation."""

    async def forward(self, text: str) -> Tagged:
        return Tagged(text, len(text))


class Undeclared:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Undeclared({self.text!r})"


class MakeUndeclared(Module):
    async def forward(self, text):  # no annotation: nothing declared
        return Undeclared(text)


class Pair(Module):
    def __init__(self) -> None:
        super().__init__()
        self.judge = LLMInference("llm", response_format=Verdict)
        self.tag = Tag()

    def forward(self, text: str) -> Any:
        return (self.judge(text), {"tag": self.tag(text)})


async def test_declared_outputs_come_back_as_the_same_types_after_resume(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    server.responder = lambda body: '{"label": "ok", "score": 0.5}'
    first = await run(Pair(), ITEMS, resources=manager, checkpoint_dir=tmp_path)
    resumed = await run(Pair(), ITEMS, resources=manager, checkpoint_dir=tmp_path)
    assert server.stats.requests == 3
    assert resumed == first
    verdict, rest = resumed[0]
    assert isinstance(resumed[0], tuple) and isinstance(verdict, Verdict)
    assert rest["tag"] == Tagged("a", 1) and isinstance(rest["tag"], Tagged)


async def test_an_undeclared_custom_output_is_refused_when_written_not_stored_as_repr(
    manager: ResourceManager, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointError, match=r"item \d cannot be checkpointed.*Undeclared"):
        await run(MakeUndeclared(), ITEMS, resources=manager, checkpoint_dir=tmp_path)
    assert not (tmp_path / "items.jsonl").read_text()  # nothing half-true was stored


class Judge(Module):
    """The program's output is declared as a model by its response format."""

    def __init__(self) -> None:
        super().__init__()
        self.judge = LLMInference("llm", response_format=Verdict)

    def forward(self, text: str) -> Verdict:
        return self.judge(text)


@pytest.mark.parametrize(
    ("make", "planted"),
    [
        (lambda: LLMInference("llm", response_format=Verdict), "just a string"),
        (Judge, {"label": "ok", "score": 0.5}),  # the right data, but not restored as Verdict
        (Tag, "a"),
    ],
    ids=["response-format", "forward-annotation", "dataclass"],
)
async def test_a_line_whose_output_is_not_the_declared_type_is_refused(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path, make: Any, planted: Any
) -> None:
    server.responder = lambda body: '{"label": "ok", "score": 0.5}'
    await run(make(), ITEMS, resources=manager, checkpoint_dir=tmp_path)

    def plant(lines: list[dict[str, Any]]) -> None:
        lines[1]["output"] = planted
        lines[1].pop("shape", None)

    rewrite(tmp_path, plant)
    with pytest.raises(CheckpointError, match=r"items\.jsonl:2: .*(Verdict|Tagged)"):
        await run(make(), ITEMS, resources=manager, checkpoint_dir=tmp_path)


class Mislabelled(Module):
    async def forward(self, text: str) -> Tagged:
        return text  # type: ignore[return-value]  # says Tagged, returns a str


async def test_an_output_that_is_not_its_declared_type_is_refused_when_written(
    manager: ResourceManager, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointError, match=r"item \d cannot be checkpointed: .*str.*Tagged"):
        await run(Mislabelled(), ITEMS, resources=manager, checkpoint_dir=tmp_path)
    assert not (tmp_path / "items.jsonl").read_text()


# ------------------------------------------------------------- identity
async def test_a_changed_prompt_is_a_mismatch_naming_the_parameter_not_a_silent_resume(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    await run(LLMInference("llm", "Prompt A"), ITEMS, resources=manager, checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointMismatchError, match="parameter 'system_prompt'"):
        await run(
            LLMInference("llm", "Prompt B"), ITEMS, resources=manager, checkpoint_dir=tmp_path
        )
    with pytest.raises(
        CheckpointMismatchError, match=r"settings of module '\(root\)': temperature"
    ):
        await run(
            LLMInference("llm", "Prompt A", temperature=0.2),
            ITEMS,
            resources=manager,
            checkpoint_dir=tmp_path,
        )
    with pytest.raises(CheckpointMismatchError, match="response_format"):
        await run(
            LLMInference("llm", "Prompt A", response_format=Verdict),
            ITEMS,
            resources=manager,
            checkpoint_dir=tmp_path,
        )
    assert server.stats.requests == 3


async def test_a_changed_model_behind_the_alias_is_a_mismatch(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    program = LLMInference("llm", "Prompt A")
    await run(program, ITEMS, resources=manager, checkpoint_dir=tmp_path)
    other = ResourceConfig({"llm": endpoint(server, model="gpt-4o")})
    async with ResourceManager(other) as second:
        with pytest.raises(CheckpointMismatchError, match=r"model of alias 'llm'.*gpt-4o now"):
            await run(program, ITEMS, resources=second, checkpoint_dir=tmp_path)
    assert server.stats.requests == 3


async def test_a_learned_prompt_set_after_training_is_noticed(
    manager: ResourceManager, tmp_path: Path
) -> None:
    program = LLMInference("llm", "Prompt A")
    await run(program, ITEMS, resources=manager, checkpoint_dir=tmp_path)
    program.system_prompt.value = "Prompt learned by an optimizer"
    with pytest.raises(CheckpointMismatchError, match="system_prompt"):
        await run(program, ITEMS, resources=manager, checkpoint_dir=tmp_path)
