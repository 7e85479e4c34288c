"""Programs and helpers shared by the execution tests.

The programs are seed ``000``'s examples. `label_prompts` gives every LLM
call a system prompt equal to its module path, so a test can tell from the
server's request log which node sent which request (`path_of`), and
`labelled_reply` answers each request with a text naming its node.
"""

from __future__ import annotations

from typing import Any

from plait import LLMInference, Module, Parameter, ResourceConfig
from plait.testing import RequestRecord, ScriptedServer
from plait.tracing import InferenceGraph

FAST_RETRY = {"retry_base_delay": 0.01, "retry_max_delay": 0.02}


def endpoint(server: ScriptedServer, **options: Any) -> dict[str, Any]:
    """Returns the settings of an OpenAI-compatible endpoint on the scripted server."""
    return server.endpoint(**{**FAST_RETRY, **options})


def config_for(server: ScriptedServer, **options: Any) -> ResourceConfig:
    """Returns a config whose ``"*"`` entry sends every alias to ``server``."""
    return ResourceConfig({"*": endpoint(server, **options)})


# ------------------------------------------------------------------ requests
def system_of(body: dict[str, Any]) -> str:
    """Returns the system message of a chat request body ("" when there is none)."""
    for message in body["messages"]:
        if message["role"] == "system":
            return message["content"]
    return ""


def user_of(body: dict[str, Any]) -> str:
    """Returns the last user message of a chat request body."""
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def path_of(record: RequestRecord) -> str:
    """Returns the node that sent a request of a `label_prompts` program."""
    return system_of(record.body)


def labelled_reply(body: dict[str, Any]) -> str:
    """A responder: ``reply-from-<system prompt>``."""
    return f"reply-from-{system_of(body)}"


def refuse_marker(marker: str):
    """A responder that echoes, but raises (the server answers 500) when ``marker`` is asked."""

    def responder(body: dict[str, Any]) -> str:
        if marker in user_of(body):
            raise RuntimeError(f"cannot answer {marker}")
        return "echo: " + user_of(body)

    return responder


def by_path(server: ScriptedServer) -> dict[str, RequestRecord]:
    """Returns the request of each node (each node must have sent exactly one)."""
    records: dict[str, RequestRecord] = {}
    for record in server.stats.log:
        path = path_of(record)
        assert path not in records, f"{path} sent two requests"
        records[path] = record
    return records


def label_prompts(module: Module) -> Module:
    """Sets every LLMInference's system prompt to its module path; returns ``module``."""
    for path, sub in module.named_modules():
        if isinstance(sub, LLMInference):
            sub.system_prompt = Parameter(path, requires_grad=False)
    return module


def llm_ancestors(graph: InferenceGraph, node_id: str) -> set[str]:
    """Returns the nearest LLM nodes upstream of ``node_id``, looking through other nodes."""
    found: set[str] = set()
    stack = list(graph.nodes[node_id].dependencies)
    while stack:
        dep = graph.nodes[stack.pop()]
        if isinstance(dep.module, LLMInference):
            found.add(dep.id)
        else:
            stack.extend(dep.dependencies)
    return found


# ------------------------------------------------------------------ programs
class Ask(Module):
    """One LLM call under a composite (so its node id is ``ask``)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.ask = LLMInference(alias="llm", **settings)

    def forward(self, text: str) -> Any:
        return self.ask(text)


class Shout(Module):
    """A plain-Python module: no LLM below it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def forward(self, text: str) -> str:
        self.seen.append(text)
        return text.upper()
