"""The composite programs of seed 000, shared by every test suite that needs them.

Each program takes a ``leaf`` factory (the tracing tests swap in plain `Echo`
modules to run eagerly) and a ``prompt`` hook giving each call's system prompt
from its role and the seed's text (the training tests make some learnable).
`AssistantGeneration` is the seed's parameterized module with its own
``backward``, written as the seed writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plait import BackwardContext, BackwardResult, LLMInference, Module, Parameter, Value

Leaf = Callable[..., Module]
PromptFor = Callable[[str, str], "str | Parameter"]
"""``prompt(role, seed_text)`` → the system prompt of the call named ``role``."""


def seed_prompt(role: str, text: str) -> str:
    """Returns the seed's own (fixed) prompt text."""
    return text


class SummarizeAndAnalyze(Module):
    """Seed 000: a chain of two calls."""

    def __init__(self, leaf: Leaf = LLMInference, prompt: PromptFor = seed_prompt) -> None:
        super().__init__()
        self.summarizer = leaf(
            alias="fast_llm", system_prompt=prompt("summarizer", "You are a concise summarizer.")
        )
        self.analyzer = leaf(
            alias="smart_llm", system_prompt=prompt("analyzer", "You are a thorough analyst.")
        )

    def forward(self, text: str) -> str:
        summary = self.summarizer(text)
        analysis = self.analyzer(summary)
        return analysis


class MultiPerspectiveAnalysis(Module):
    """Seed 000: three independent calls on the same input (fan-out)."""

    def __init__(self, leaf: Leaf = LLMInference, prompt: PromptFor = seed_prompt) -> None:
        super().__init__()
        for view in ("technical", "business", "user"):
            text = f"Analyze from a {view} perspective."
            setattr(self, view, leaf(alias="llm", system_prompt=prompt(view, text)))

    def forward(self, text: str) -> dict[str, Any]:
        return {
            "technical": self.technical(text),
            "business": self.business(text),
            "user": self.user(text),
        }


class Synthesizer(Module):
    """Seed 000: the perspectives, then one synthesis reading all three (fan-in)."""

    def __init__(self, leaf: Leaf = LLMInference, prompt: PromptFor = seed_prompt) -> None:
        super().__init__()
        self.analyzer = MultiPerspectiveAnalysis(leaf, prompt)
        self.synthesizer = leaf(
            alias="smart_llm",
            system_prompt=prompt(
                "synthesizer", "Synthesize multiple perspectives into a cohesive report."
            ),
        )

    def forward(self, text: str) -> Any:
        perspectives = self.analyzer(text)
        combined = "\n\n".join(
            f"## {name.title()} Perspective\n{analysis}" for name, analysis in perspectives.items()
        )
        return self.synthesizer(combined)


class DeepPipeline(Module):
    """Seed 000: the three programs above nested into one (nine calls, one flat graph)."""

    def __init__(self, leaf: Leaf = LLMInference, prompt: PromptFor = seed_prompt) -> None:
        super().__init__()
        self.stage1 = SummarizeAndAnalyze(leaf, prompt)
        self.stage2 = MultiPerspectiveAnalysis(leaf, prompt)
        self.stage3 = Synthesizer(leaf, prompt)

    def forward(self, text: str) -> Any:
        result1 = self.stage1(text)
        result2 = self.stage2(result1)
        return self.stage3(str(result2))


class AssistantGeneration(Module):
    """Seed 000: an assistant with optimizable instructions and its own backward.

    The system prompt can be improved through backward passes.
    """

    def __init__(self, assistant_instructions: str, temperature: float = 1.0) -> None:
        super().__init__()
        # This parameter can be optimized
        self.assistant_instructions = Parameter(
            assistant_instructions,
            description=(
                "Defines the assistant's core behavior and tone. "
                "Should be stable but improvable based on feedback."
            ),
        )

        # LLM for generating responses
        self.llm = LLMInference(alias="assistant_llm", temperature=temperature)

        # LLM for backward pass (prompt optimization)
        self.optimizer_llm = LLMInference(
            alias="optimizer_llm",
            temperature=0.7,
            system_prompt="You help improve prompts based on feedback.",
        )

    def forward(self, request: str) -> str:
        # Combine instructions with request
        full_prompt = f"{self.assistant_instructions}\n\nUser: {request}"
        return self.llm(full_prompt)

    def backward(self, feedback: Value, ctx: BackwardContext) -> BackwardResult:
        """Generate feedback for the instructions parameter."""
        result = BackwardResult()

        # Value for the input request
        result.input_feedback["request"] = feedback.payload

        # Use LLM to generate parameter feedback
        if self.assistant_instructions.requires_grad:
            improvement_prompt = f"""
Current instructions: {self.assistant_instructions.value}
Output that was produced: {ctx.output}
Value on output: {feedback.payload}

What specific changes to the instructions would improve the output?
"""
            # Note: This would be traced and executed as part of backward graph
            improvement = self.optimizer_llm(improvement_prompt)
            result.parameter_feedback["assistant_instructions"] = improvement

        return result
