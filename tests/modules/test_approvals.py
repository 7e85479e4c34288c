"""A person's "yes" runs exactly the calls that were shown, once (SPEC §4.8 "Approvals").

The scripted model asks for tool calls over loopback HTTP; the tools are real
and write what ran to a file, so each test checks what actually happened: an
edited, forged, replayed or foreign resume state is refused before any tool
runs, and a call the person never saw never runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import plait
from plait import ConfirmationRequired, ReAct, ResourceConfig, ResumeState, tool
from plait.confirmation import set_approval_key, set_approval_ledger
from plait.errors import ResumeRefusedError
from plait.testing import ScriptedServer


@pytest.fixture(autouse=True)
def _default_approvals():
    """Each test starts and ends with the process's own key and in-memory ledger."""
    set_approval_key(None)
    set_approval_ledger(None)
    yield
    set_approval_key(None)
    set_approval_ledger(None)


def payments_agent(log: Path, *, name: str = "pay") -> ReAct:
    """An agent whose one tool moves money (needs approval) and writes each payment to ``log``."""

    @tool(name=name, require_confirmation=True)
    def send_money(amount: int, to: str) -> str:
        """Sends money to someone."""
        with log.open("a") as file:
            file.write(f"{amount} {to}\n")
        return f"sent {amount} to {to}"

    return ReAct("request -> answer", tools=[send_money])


def mail_agent(log: Path) -> ReAct:
    """Another agent with a tool of the same name ("pay") that does something else."""

    @tool(name="pay", require_confirmation=True)
    def send_invoice(amount: int, to: str) -> str:
        """Mails an invoice."""
        with log.open("a") as file:
            file.write(f"invoice {amount} {to}\n")
        return f"invoiced {to}"

    return ReAct("request -> answer", tools=[send_invoice])


def calls_then_answer(*calls: dict[str, Any]) -> Any:
    """A responder: the given tool calls first; then an answer made of the tool results."""

    def responder(body: dict[str, Any]) -> Any:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return {"content": "On it.", "tool_calls": list(calls)}
        return json.dumps({"answer": " / ".join(results)})

    return responder


PAY_BOB = calls_then_answer(
    {"id": "call_1", "name": "pay", "arguments": {"amount": 500, "to": "bob"}}
)


def config_of(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0)})


async def pause_of(agent: ReAct, server: ScriptedServer, **inputs: Any) -> ConfirmationRequired:
    with pytest.raises(ConfirmationRequired) as paused:
        await agent.bind(config_of(server))(**(inputs or {"request": "pay bob 500"}))
    return paused.value


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ------------------------------------------------------------ item 1: unseen calls
async def test_two_calls_sharing_an_id_are_each_asked_about(tmp_path: Path) -> None:
    responder = calls_then_answer(
        {"id": "call_1", "name": "pay", "arguments": {"amount": 5, "to": "old-landlord"}},
        {"id": "call_1", "name": "pay", "arguments": {"amount": 9999, "to": "mallory"}},
    )
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=responder) as server:
        agent = payments_agent(log)
        first = await pause_of(agent, server)
        assert first.arguments == {"amount": 5, "to": "old-landlord"}

        with pytest.raises(ConfirmationRequired) as second:
            await agent(request="pay bob 500", resume_state=ResumeState(first, "yes"))
        assert lines(log) == ["5 old-landlord"]  # the call nobody was shown did not run
        assert second.value.arguments == {"amount": 9999, "to": "mallory"}
        assert second.value.confirmation_id != first.confirmation_id

        result = await agent(request="pay bob 500", resume_state=ResumeState(second.value, "no"))
    assert lines(log) == ["5 old-landlord"]
    assert [step.ok for step in result.trajectory] == [True, False]
    assert len({step.call_id for step in result.trajectory}) == 2


# ------------------------------------------------------- item 2: tamper-evidence
def edited(stored: str, amount: int, to: str) -> str:
    """The stored state with the paused call changed to another payment (as an attacker would)."""
    data = json.loads(stored)
    arguments = {"amount": amount, "to": to}
    data["pause"]["arguments"] = arguments
    data["pause"]["context"]["pending"]["calls"][0]["arguments"] = json.dumps(arguments)
    return json.dumps(data)


async def test_a_state_edited_after_yes_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        agent = payments_agent(log)
        pending = await pause_of(agent, server)
        stored = ResumeState(pending, "yes").to_json()

        with pytest.raises(ResumeRefusedError, match="changed after it was made"):
            ResumeState.from_json(edited(stored, 1_000_000, "mallory"))

        pending.context["pending"]["calls"][0]["arguments"] = '{"amount": 1000000, "to": "mallory"}'
        with pytest.raises(ResumeRefusedError, match="ask the person again"):
            await agent(request="pay bob 500", resume_state=ResumeState(pending, "yes"))
    assert lines(log) == []


async def test_a_state_for_another_tool_under_the_same_id_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        pending = await pause_of(payments_agent(log), server)
        data = json.loads(ResumeState(pending, "yes").to_json())
        paused_call = data["pause"]["context"]["pending"]["calls"][0]
        data["pause"]["tool_name"] = paused_call["name"] = "drop"
        with pytest.raises(ResumeRefusedError, match="changed after it was made"):
            ResumeState.from_json(json.dumps(data))


async def test_a_forged_or_unsealed_state_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        pending = await pause_of(payments_agent(log), server)
        data = json.loads(pending.to_json())
        data["seal"] = "0" * 64
        with pytest.raises(ResumeRefusedError, match="changed after it was made"):
            ConfirmationRequired.from_json(json.dumps(data))
        del data["seal"]
        with pytest.raises(ResumeRefusedError, match="not sealed"):
            ConfirmationRequired.from_json(json.dumps(data))
    assert lines(log) == []


async def test_a_state_sealed_with_another_key_is_refused(tmp_path: Path) -> None:
    set_approval_key("a" * 64)
    async with ScriptedServer(responder=PAY_BOB) as server:
        stored = (await pause_of(payments_agent(tmp_path / "p.txt"), server)).to_json()
    set_approval_key("b" * 64)
    with pytest.raises(ResumeRefusedError, match="another key"):
        ConfirmationRequired.from_json(stored)
    set_approval_key("a" * 64)
    assert ConfirmationRequired.from_json(stored).tool_name == "pay"


def test_a_short_approval_key_is_a_config_error() -> None:
    with pytest.raises(plait.errors.ConfigError, match="at least 32"):
        set_approval_key("secret")


# ---------------------------------------------------------------- item 3: replays
async def test_an_approval_is_used_once(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        agent = payments_agent(log)
        pending = await pause_of(agent, server)
        state = ResumeState(pending, "yes")
        stored = state.to_json()
        await agent(request="pay bob 500", resume_state=state)
        for replay in (state, ResumeState.from_json(stored), ResumeState.from_json(stored)):
            with pytest.raises(ResumeRefusedError, match="already used") as refused:
                await agent(request="pay bob 500", resume_state=replay)
            assert pending.approval_id in str(refused.value)  # the id an application keeps
    assert lines(log) == ["500 bob"]


# ----------------------------------------------------- item 4: another agent
async def test_a_state_from_another_agent_with_a_same_named_tool_is_refused(
    tmp_path: Path,
) -> None:
    payments, invoices = tmp_path / "payments.txt", tmp_path / "invoices.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        agent_a = payments_agent(payments).bind(config_of(server))
        agent_b = mail_agent(invoices).bind(config_of(server))
        with pytest.raises(ConfirmationRequired) as paused:
            await agent_b(request="pay bob 500")
        state = ResumeState(paused.value, "yes")
        with pytest.raises(ResumeRefusedError, match="another agent"):
            await agent_a(request="pay bob 500", resume_state=state)
        assert lines(payments) == [] and lines(invoices) == []

        await agent_b(request="pay bob 500", resume_state=state)  # refused, so not used up
    assert lines(invoices) == ["invoice 500 bob"] and lines(payments) == []


async def test_a_resume_state_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    async with ScriptedServer(responder=PAY_BOB) as server:
        agent = payments_agent(tmp_path / "payments.txt").bind(config_of(server))
        with pytest.raises(ResumeRefusedError, match=r"takes a ResumeState\(pause, answer\)"):
            await agent(request="pay bob 500", resume_state="yes")


# ------------------------------------------------------- item 13: nested JSON
def test_deeply_nested_json_in_a_resume_state_is_a_plait_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ResumeRefusedError, match="nested"):
        ResumeState.from_json('{"pause": ' + deep + "}")
    with pytest.raises(ResumeRefusedError, match="nested"):
        ConfirmationRequired.from_json(deep)


async def test_deeply_nested_edited_arguments_are_a_plait_error(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        agent = payments_agent(log)
        pending = await pause_of(agent, server)
        deep = '{"amount": 5, "to": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}"
        with pytest.raises(ResumeRefusedError, match="nested"):
            await agent(request="pay bob 500", resume_state=ResumeState(pending, deep))
        extra: list[Any] = []
        for _ in range(200):
            extra = [extra]
        stored = json.dumps({"pause": pending.to_dict(), "response": "yes", "extra": extra})
        with pytest.raises(ResumeRefusedError, match="nested"):
            ResumeState.from_json(stored)
    assert lines(log) == []


# ------------------------------------------- issue 21 item 11: what ran, inputs
async def test_the_trajectory_records_the_edited_arguments_that_ran(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        agent = payments_agent(log)
        pending = await pause_of(agent, server)
        result = await agent(
            request="pay bob 500", resume_state=ResumeState(pending, {"amount": 5, "to": "bob"})
        )
        shown_to_model = [m for m in server.stats.log[-1].body["messages"] if m["role"] == "tool"]
    assert lines(log) == ["5 bob"]
    step = result.trajectory[0]
    assert step.args == {"amount": 5, "to": "bob"} and "sent 5 to bob" in step.result
    assert '"amount": 5' in shown_to_model[0]["content"]  # the model learns what ran


async def test_a_resume_with_other_inputs_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        agent = payments_agent(log)
        pending = await pause_of(agent, server)
        state = ResumeState(pending, "yes")
        with pytest.raises(ResumeRefusedError, match="other inputs"):
            await agent(request="pay mallory 500", resume_state=state)
        assert lines(log) == []
        await agent(request="pay bob 500", resume_state=state)  # the paused inputs: accepted
    assert lines(log) == ["500 bob"]


# ------------------------------------- a module of your own (issue 22 item 5)
class Payer(plait.Module):
    """A custom module that resumes (its forward takes resume_state=): pays, then confirms."""

    def __init__(self, log: Path, *, twice: bool = False) -> None:
        super().__init__()
        self.twice = twice

        @tool(require_confirmation=True)
        def pay(amount: int, to: str) -> str:
            """Sends money to someone."""
            with log.open("a") as file:
                file.write(f"{amount} {to}\n")
            return f"sent {amount} to {to}"

        self.pay = pay

    async def forward(self, request: str, resume_state: Any = None) -> str:
        amount, to = int(request.split()[2]), request.split()[1]
        if resume_state is not None:
            assert resume_state.exception.context["note"] == "asked about " + to
        try:
            sent = await self.pay.acall(amount=amount, to=to)
            if self.twice:  # the same call again: a yes covered the first only
                sent = await self.pay.acall(amount=amount, to=to)
        except ConfirmationRequired as pending:
            pending.context["note"] = "asked about " + to
            raise
        return sent


class OtherPayer(Payer):
    """The same code under another class: another agent."""


class Desk(plait.Module):
    """Holds a payer under one name, so that two payers can sit at the same path."""

    def __init__(self, payer: Payer) -> None:
        super().__init__()
        self.payer = payer

    async def forward(self, request: str) -> str:
        return await self.payer(request)


async def custom_pause(module: plait.Module, request: str = "pay bob 500") -> ConfirmationRequired:
    with pytest.raises(ConfirmationRequired) as paused:
        await module.aforward(request)
    return paused.value


async def test_a_custom_module_pause_is_sealed_and_used_once(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    payer = Payer(log)
    pending = await custom_pause(payer)
    assert pending.context["module"] == "Payer" and pending.seal is not None
    stored = ResumeState(pending, "yes").to_json()

    pending.context["note"] = "asked about mallory"  # edited after the pause was made
    with pytest.raises(ResumeRefusedError, match="changed after it was made"):
        await payer.aforward("pay bob 500", resume_state=ResumeState(pending, "yes"))
    with pytest.raises(ResumeRefusedError, match="other inputs"):
        await payer.aforward("pay mallory 500", resume_state=ResumeState.from_json(stored))
    assert lines(log) == []

    assert await payer.aforward(resume_state=ResumeState.from_json(stored)) == "sent 500 to bob"
    with pytest.raises(ResumeRefusedError, match="already used"):
        await payer.aforward(resume_state=ResumeState.from_json(stored))
    assert lines(log) == ["500 bob"]


async def test_a_custom_module_pause_is_refused_by_another_module_at_its_path(
    tmp_path: Path,
) -> None:
    log = tmp_path / "payments.txt"
    pending = await custom_pause(Desk(Payer(log)))
    assert pending.context["module"] == "payer"
    state = ResumeState(pending, "yes")
    with pytest.raises(ResumeRefusedError, match="another agent"):
        await Desk(OtherPayer(log)).aforward("pay bob 500", resume_state=state)
    assert lines(log) == []
    assert await Desk(Payer(log)).aforward("pay bob 500", resume_state=state) == "sent 500 to bob"


async def test_a_yes_to_a_custom_module_runs_the_paused_call_once(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    payer = Payer(log, twice=True)
    pending = await custom_pause(payer)
    with pytest.raises(ConfirmationRequired) as again:
        await payer.aforward(resume_state=ResumeState(pending, "yes"))
    assert again.value.approval_id != pending.approval_id
    assert lines(log) == ["500 bob"]


async def test_a_custom_module_that_changes_an_inner_agents_pause_is_told(
    tmp_path: Path,
) -> None:
    class Wrapper(plait.Module):
        def __init__(self, agent: ReAct) -> None:
            super().__init__()
            self.agent = agent

        async def forward(self, request: str, resume_state: Any = None) -> Any:
            try:
                return await self.agent(request=request)
            except ConfirmationRequired as pending:
                pending.context["saved_data"] = "mine"  # the agent sealed it: this breaks it
                raise

    async with ScriptedServer(responder=PAY_BOB) as server:
        wrapper = Wrapper(payments_agent(tmp_path / "payments.txt")).bind(config_of(server))
        with pytest.raises(plait.errors.PlaitError, match="changed the context of a pause"):
            await wrapper(request="pay bob 500")


# --------------------------------- Predict runs tools through the same approvals (item 6)
async def test_predict_with_tools_pauses_and_resumes_like_react(tmp_path: Path) -> None:
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=PAY_BOB) as server:
        predict = plait.Predict("request -> answer", tools=payments_agent(log).tools.values())
        invoices = mail_agent(tmp_path / "invoices.txt").tools.values()
        mailer = plait.Predict("request -> answer", tools=invoices).bind(config_of(server))
        pending = await pause_of(predict, server)
        with pytest.raises(ResumeRefusedError, match="another agent"):
            await mailer(resume_state=ResumeState(pending, "yes"))
        pending.context["pending"]["calls"][0]["arguments"] = '{"amount": 9999, "to": "mallory"}'
        with pytest.raises(ResumeRefusedError, match="changed after it was made"):
            await predict(request="pay bob 500", resume_state=ResumeState(pending, "yes"))
        assert lines(log) == []

        pending = await pause_of(predict, server)
        result = await predict(resume_state=ResumeState(pending, "yes"))
        with pytest.raises(ResumeRefusedError, match="already used"):
            await predict(resume_state=ResumeState(pending, "yes"))
    assert result.answer == "sent 500 to bob" and lines(log) == ["500 bob"]


# ------------------------------------- another process: configured key, own ledger
SCRIPT = '''
import asyncio, json, sqlite3, sys
from pathlib import Path

from plait import ConfirmationRequired, ReAct, ResourceConfig, ResumeState, tool
from plait.confirmation import set_approval_ledger
from plait.errors import ResumeRefusedError

endpoint, mode, folder = json.loads(sys.argv[1]), sys.argv[2], Path(sys.argv[3])


@tool(require_confirmation=True)
def pay(amount: int, to: str) -> str:
    """Sends money to someone."""
    with (folder / "payments.txt").open("a") as file:
        file.write(f"{amount} {to}\\n")
    return f"sent {amount} to {to}"


class SQLiteLedger:
    """The application's store of used approvals, shared by its processes."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS used (approval_id TEXT PRIMARY KEY)")

    def use(self, approval_id):
        try:
            self.db.execute("INSERT INTO used VALUES (?)", (approval_id,))
        except sqlite3.IntegrityError:
            return False
        return True


async def main():
    set_approval_ledger(SQLiteLedger(folder / "used.sqlite"))
    agent = ReAct("request -> answer", tools=[pay]).bind(ResourceConfig({"*": endpoint}))
    if mode == "pause":
        try:
            await agent(request="pay bob 500")
        except ConfirmationRequired as pending:
            (folder / "pause.json").write_text(pending.to_json())
            print("paused")
        return
    try:
        pending = ConfirmationRequired.from_json((folder / "pause.json").read_text())
        result = await agent(resume_state=ResumeState(pending, "yes"))
    except ResumeRefusedError as refused:
        print(f"refused: {refused}")
        return
    print(f"answer: {result.answer}")


asyncio.run(main())
'''


async def run_script(script: Path, server: ScriptedServer, mode: str, key: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PLAIT_APPROVAL_KEY"}
    env["PYTHONPATH"] = str(Path(plait.__file__).parents[1])
    if key is not None:
        env["PLAIT_APPROVAL_KEY"] = key
    endpoint = json.dumps(server.endpoint(max_retries=0))
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), endpoint, mode, str(script.parent),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, err.decode()
    return out.decode().strip()


async def test_a_pause_resumes_once_in_another_process_with_a_configured_key(
    tmp_path: Path,
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT)
    key = "k" * 64
    async with ScriptedServer(responder=calls_then_answer(
        {"id": "call_1", "name": "pay", "arguments": {"amount": 500, "to": "bob"}}
    )) as server:  # fmt: skip
        assert await run_script(script, server, "pause", key) == "paused"
        refused = await run_script(script, server, "resume", None)  # this process's own key
        assert refused.startswith("refused:") and "another key" in refused
        assert await run_script(script, server, "resume", key) == "answer: sent 500 to bob"
        replayed = await run_script(script, server, "resume", key)  # a new process, same store
    assert replayed.startswith("refused:") and "already used" in replayed
    assert lines(tmp_path / "payments.txt") == ["500 bob"]
