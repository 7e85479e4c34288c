"""The chat page at ``/`` in a real headless Chromium: streamed text, approve, reject.

The scripted model answers over loopback HTTP: the ``chat`` program drafts a reply (streamed
into the page) and then polishes it, a call the test holds until it has seen the draft, so
the page is shown to render text before the run ends. The ``notes`` agent asks for a
``save_note`` call that needs approval; its tool appends to a file, so the test checks what
really ran. With ``PLAIT_UPDATE_SCREENSHOT=1`` the run also writes ``docs/serve_chat.png``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plait import History, LLMInference, Module, ReAct, tool
from plait.serve import app
from plait.testing import server_in_thread
from serve.support import serving_in_thread, upstream

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "serve_chat.png"

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason=f"needs Chromium ({CHROMIUM}) and chromedriver ({CHROMEDRIVER}): apt-get install "
    "chromium chromium-driver",
)

DRAFT = "Hello there! A first draft of the answer"


class Drafted(Module):
    """Drafts a reply to the conversation, then polishes it."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("llm", "Draft a reply.")
        self.polish = LLMInference("llm", "Polish the reply.")

    def forward(self, history: History) -> str:
        return self.polish(self.draft(history))


def notes_agent(notes: Path) -> ReAct:
    @tool(require_confirmation=True)
    def save_note(text: str) -> str:
        """Saves a note for the user."""
        with notes.open("a", encoding="utf-8") as file:
            file.write(text + "\n")
        return f"Saved the note: {text}"

    # one text input: the page sends it the last message of the conversation
    return ReAct("request -> reply", tools=[save_note], max_iters=3, on_decline="raise")


class Model:
    """The scripted model: drafts, polishes when allowed, and asks to save notes."""

    def __init__(self) -> None:
        self.polish_allowed = threading.Event()
        self.polishing = threading.Event()
        """Set when a polish call arrives: its run holds a place until polish_allowed."""

    async def __call__(self, body: dict[str, Any]) -> Any:
        messages = body["messages"]
        if body.get("tools"):
            results = [m["content"] for m in messages if m["role"] == "tool"]
            if results:
                return json.dumps({"reply": "Done. " + " / ".join(results)})
            asked = [m["content"] for m in messages if m["role"] == "user"][-1]
            text = asked.rpartition("note:")[2].strip()
            return {
                "tool_calls": [{"id": "call_1", "name": "save_note", "arguments": {"text": text}}]
            }
        if "Polish" in str(messages[0]["content"]):
            self.polishing.set()
            await asyncio.to_thread(self.polish_allowed.wait, 60)
            return "Polished: " + DRAFT + ", ready."
        return DRAFT


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=900,900")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def say(browser: Any, message: str) -> None:
    """Types ``message`` in the page's text box once it takes input, and sends it."""
    from selenium.webdriver.common.by import By  # optional dependency (selenium)
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.wait import WebDriverWait

    wait = WebDriverWait(browser, 60)
    box = wait.until(lambda b: b.find_element(By.ID, "text"))
    wait.until(lambda _: box.is_enabled())
    box.send_keys(message, Keys.ENTER)


def test_the_page_streams_text_and_runs_a_tool_call_only_once_approved(
    browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    notes = tmp_path / "notes.txt"
    model = Model()
    wait = WebDriverWait(browser, 60)

    def texts(selector: str) -> list[str]:
        return [node.text for node in browser.find_elements(By.CSS_SELECTOR, selector)]

    with server_in_thread(responder=model, stream_pieces=4) as server:
        programs = {"chat": Drafted(), "notes": notes_agent(notes)}
        with serving_in_thread(app(programs, upstream(server))) as url:
            browser.get(url + "/")
            picker = Select(wait.until(lambda b: b.find_element(By.ID, "program")))
            wait.until(lambda _: len(picker.options) == 2)
            picker.select_by_value("chat")
            say(browser, "Hi!")
            # the draft is on the page while the run still waits for the polish
            wait.until(lambda _: DRAFT in " ".join(texts(".msg.assistant.live")))
            assert not texts(".msg.assistant:not(.live)")
            model.polish_allowed.set()
            wait.until(lambda _: texts(".msg.assistant:not(.live)"))
            assert texts(".msg.assistant:not(.live)") == [f"Polished: {DRAFT}, ready."]

            picker.select_by_value("notes")
            say(browser, "note: buy <b>milk</b>")
            approval = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".approval"))
            shown = approval.find_element(By.TAG_NAME, "pre")
            assert json.loads(shown.text) == {"text": "buy <b>milk</b>"}
            assert "&lt;b&gt;milk" in shown.get_attribute("innerHTML")  # text, never markup
            assert not notes.exists()  # nothing runs before the person says yes
            approval.find_element(By.CSS_SELECTOR, "button.approve").click()
            wait.until(lambda _: texts(".msg.assistant:not(.live)"))
            assert texts(".msg.assistant") == ["Done. Saved the note: buy <b>milk</b>"]
            assert any("Tool result: Saved the note" in note for note in texts(".note"))
            browser.save_screenshot(str(tmp_path / "serve_chat.png"))

            say(browser, "note: call mum")
            wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".approval")) == 2)
            second = browser.find_elements(By.CSS_SELECTOR, ".approval")[1]
            second.find_element(By.CSS_SELECTOR, "button.reject").click()
            wait.until(lambda _: any(n.startswith("Rejected:") for n in texts(".note")))
            calls = [n for n in texts(".note") if n.startswith("Tool call:")]
            assert len(calls) == 2 and "call mum" in calls[1]  # each call shown once
    rejected = next(n for n in texts(".note") if n.startswith("Rejected:"))
    assert "declined to run save_note" in rejected
    assert notes.read_text(encoding="utf-8").splitlines() == ["buy <b>milk</b>"]
    if os.environ.get("PLAIT_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(tmp_path / "serve_chat.png", SCREENSHOT)


def test_with_api_keys_the_page_asks_for_the_key_once_and_sends_it(
    browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.wait import WebDriverWait

    model = Model()
    model.polish_allowed.set()
    wait = WebDriverWait(browser, 60)
    with server_in_thread(responder=model) as server:
        served = app({"chat": Drafted()}, upstream(server), api_keys=("page-test-key",))
        with serving_in_thread(served) as url:
            browser.get(url + "/")
            key = wait.until(lambda b: b.find_element(By.ID, "key"))
            wait.until(lambda _: key.is_displayed())
            key.send_keys("page-test-key", Keys.ENTER)
            say(browser, "Hi!")
            reply = wait.until(
                lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.assistant:not(.live)")
            )
            assert reply[0].text == f"Polished: {DRAFT}, ready."
            browser.refresh()  # the key is kept for the tab: not asked again
            box = wait.until(lambda b: b.find_element(By.ID, "text"))
            wait.until(lambda _: box.is_enabled())
            assert not browser.find_element(By.ID, "key").is_displayed()


def test_an_approval_refused_for_want_of_a_place_can_be_given_again_and_runs_once(
    browser: Any, tmp_path: Path
) -> None:
    """The server's only place is taken when the person approves: the resume is answered
    429, the run still waits, the page lets the person approve again, and the call runs
    once."""
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    notes = tmp_path / "notes.txt"
    model = Model()
    wait = WebDriverWait(browser, 60)

    def texts(selector: str) -> list[str]:
        return [node.text for node in browser.find_elements(By.CSS_SELECTOR, selector)]

    with server_in_thread(responder=model) as server:
        programs = {"chat": Drafted(), "notes": notes_agent(notes)}
        served = app(programs, upstream(server), max_active=1, max_queued=0)
        with serving_in_thread(served) as url:
            browser.get(url + "/")
            picker = Select(wait.until(lambda b: b.find_element(By.ID, "program")))
            wait.until(lambda _: len(picker.options) == 2)
            picker.select_by_value("notes")
            box = browser.find_element(By.ID, "text")
            box.send_keys("note: buy milk", Keys.ENTER)
            approval = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".approval"))
            approve = approval.find_element(By.CSS_SELECTOR, "button.approve")
            chat = {"history": [{"role": "user", "content": "Hi"}]}

            def hold_the_place() -> None:
                """Another client's run takes the only place (asked again while the paused
                notes run has not given it back yet)."""
                for _ in range(600):
                    answer = httpx.post(f"{url}/programs/chat/run", json=chat, timeout=60)
                    if answer.status_code != 429:
                        return
                    time.sleep(0.1)

            held = threading.Thread(target=hold_the_place)
            held.start()
            # the chat run holds the only place once its polish call is in: one place in use
            # before that could still be the paused notes run's own (its stream ending)
            wait.until(lambda _: model.polishing.is_set())
            wait.until(lambda _: served.state.runs.admission.active == 1)
            approve.click()
            wait.until(lambda _: any(n.startswith("Error 429:") for n in texts(".note")))
            wait.until(lambda _: approve.is_enabled())  # the run still waits: ask again
            assert not notes.exists()
            model.polish_allowed.set()
            held.join(60)
            approve.click()
            wait.until(lambda _: texts(".msg.assistant:not(.live)"))
            assert texts(".msg.assistant") == ["Done. Saved the note: buy milk"]
    assert notes.read_text(encoding="utf-8").splitlines() == ["buy milk"]


def test_the_page_shows_every_tool_call_that_ran_even_under_a_reused_id(browser: Any) -> None:
    """Some models number their calls afresh each turn: a second call under an id the run
    used before is a call of its own, and the page shows it (it hid it as a repeat)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    @tool
    def look_up(topic: str) -> str:
        """Looks a topic up."""
        return f"facts about {topic}"

    def model(body: dict[str, Any]) -> Any:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if len(results) < 2:
            topic = ["tides", "moons"][len(results)]
            call = {"id": "call_1", "name": "look_up", "arguments": {"topic": topic}}
            return {"tool_calls": [call]}
        return json.dumps({"reply": " / ".join(results)})

    wait = WebDriverWait(browser, 60)
    agent = ReAct("request -> reply", tools=[look_up], max_iters=4)
    with (
        server_in_thread(responder=model) as server,
        serving_in_thread(app({"agent": agent}, upstream(server))) as url,
    ):
        browser.get(url + "/")
        say(browser, "tell me about tides and moons")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.assistant:not(.live)"))
        notes = [node.text for node in browser.find_elements(By.CSS_SELECTOR, ".note")]
    calls = [note for note in notes if note.startswith("Tool call:")]
    assert len(calls) == 2 and "tides" in calls[0] and "moons" in calls[1], notes


def test_a_rejected_call_the_model_is_told_of_reads_as_a_rejection(
    browser: Any, tmp_path: Path
) -> None:
    """With ``on_decline="tell_model"`` (the default) the person's "no" goes back to the
    model as the call's result: the page says it was rejected, not that the tool failed."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    notes = tmp_path / "notes.txt"

    @tool(require_confirmation=True)
    def save_note(text: str) -> str:
        """Saves a note for the user."""
        notes.write_text(text)
        return f"Saved the note: {text}"

    wait = WebDriverWait(browser, 60)
    agent = ReAct("request -> reply", tools=[save_note], max_iters=3)
    with (
        server_in_thread(responder=Model()) as server,
        serving_in_thread(app({"notes": agent}, upstream(server))) as url,
    ):
        browser.get(url + "/")
        say(browser, "note: call mum")
        approval = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".approval"))
        approval.find_element(By.CSS_SELECTOR, "button.reject").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.assistant:not(.live)"))
        shown = [node for node in browser.find_elements(By.CSS_SELECTOR, ".note")]
        labels = [(node.text, "failed" in node.get_attribute("class")) for node in shown]
    assert ("Rejected: save_note was not run: declined at the approval", False) in labels
    assert not any(text.startswith("Tool failed:") for text, _ in labels), labels
    assert not notes.exists()


def test_a_reply_cut_off_at_its_limit_shows_why_beside_the_error_id(browser: Any) -> None:
    """The model rambles inside a forced tool call until ``max_tokens`` cuts it: the page
    shows plait's one-line reason (the field, the limit, the fix) and the error id."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    @tool
    def look_up(topic: str) -> str:
        """Looks a topic up."""
        return f"facts about {topic}"

    def rambling(body: dict[str, Any]) -> Any:
        call = {"id": "call_1", "name": "look_up", "arguments": '{"topic": "well, first of all'}
        return {"tool_calls": [call], "finish_reason": "length"}

    wait = WebDriverWait(browser, 60)
    agent = ReAct("request -> reply", tools=[look_up], first_tool_choice="look_up", max_tokens=24)
    with (
        server_in_thread(responder=rambling) as server,
        serving_in_thread(app({"agent": agent}, upstream(server))) as url,
    ):
        browser.get(url + "/")
        say(browser, "tell me about tides")
        failed = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".note.failed"))
        shown = failed[-1].text
    assert shown.startswith("Error: the run failed: ReplyCutOffError: ")
    assert "max_tokens=24" in shown and "argument 'topic' of a call of tool 'look_up'" in shown
    assert "quote error id " in shown and "first of all" not in shown
