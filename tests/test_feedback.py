"""Feedback: what a loss returns, and the error when it is sent backward from eval mode."""

from __future__ import annotations

import pytest

from modules.scripted import scripted
from plait import LLMInference, Module, Parameter
from plait.feedback import Feedback, clip
from plait.optimization import TrainingStep


class OneCall(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", system_prompt=Parameter("Answer.", description="Tone."))

    def forward(self, question: str) -> str:
        return self.llm(question)


def never_right(output: object, target: object) -> bool:
    return False


async def test_backward_of_a_loss_computed_in_eval_mode_says_to_train_first() -> None:
    async with scripted() as (server, manager):
        step = TrainingStep(OneCall(), never_right).bind(manager)  # eval mode: no .train()
        loss = await step("What is 2 + 2?", target="4")
        assert isinstance(loss, Feedback)
        with pytest.raises(ValueError, match=r"not produced in training mode.*\.train\(\)"):
            await loss.backward()
    assert server.stats.requests == 1


def test_feedback_text_lists_score_and_items_and_clip_says_how_much_was_cut() -> None:
    feedback = Feedback("Too long.", 0.25, ["Cut the intro."])
    assert str(feedback) == "Too long.\nScore: 0.25\n- Cut the intro."
    assert clip("x" * 10, limit=4) == "xxxx… [6 more characters]"
