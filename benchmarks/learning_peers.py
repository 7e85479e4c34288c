"""The peers' side of the learning benchmark: DSPy and TextGrad on one BBH task.

Runs in the peers' own venv (never plait's), against an OpenAI-compatible
server on loopback that serves the embedded SmolLM2-135M (`learning_bench.py`
starts ``python -m llama_cpp.server`` and calls this script once per task
and method). Prints one JSON line: test accuracy, optimisation calls,
minutes. Replies are scored by `bbh_tasks.is_correct` (first word, or first
number, of the answer text), as plait's text replies are.

    /work/peers_venv/bin/python benchmarks/learning_peers.py --task boolean_expressions \\
        --method "DSPy BootstrapFewShot" --budget 400 --base-url http://127.0.0.1:8000/v1

Methods:

* ``DSPy zero-shot``, ``DSPy LabeledFewShot`` (k=4), ``DSPy BootstrapFewShot``
  (4 bootstrapped + 4 labeled demos), ``DSPy MIPROv2-light``
  (``auto="light"``, 4 + 4 demos, valset = the validation split), each on a
  ``dspy.Predict`` of the signature ``question -> answer`` with the task's
  instructions, ``temperature=0``, replies capped at 256 tokens, no cache;
* ``TextGrad (peer)``: ``TextualGradientDescent`` on the system prompt of a
  ``BlackboxLLM`` (the prompt-optimisation recipe of TextGrad's tutorial):
  minibatches of 3 training examples, a string-based correctness loss, one
  step per minibatch, the validation accuracy checked after every step and
  the step reverted when it fell; it stops when the budget is spent. A step
  that raises (the 135M model often breaks TextGrad's reply format) is
  counted and skipped.

Calls are counted where each peer makes them (``lm.history`` for DSPy, the
engine's requests for TextGrad); every call reaches the server (caches off).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bbh_tasks import TASKS, Task, is_correct

# No network here: LiteLLM (under DSPy) would try to download its price list first.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MAX_TOKENS = 256
"""Cap on every peer reply: a 135M model may otherwise ramble for thousands of tokens."""


def first_label(answer: str, task: Task) -> str | None:
    """Returns the first of the task's labels that occurs in ``answer`` as a word (casefolded).

    A second, lenient score for DSPy: on SmolLM2-135M its ChatAdapter's field
    markers often fail and its JSON fallback makes the server write a JSON
    object, so the answer field reads like ``{'question': 'True', ...}``,
    whose first word is no label. None for a task without labels.
    """
    if task.labels is None:
        return None
    labels = {label.casefold() for label in task.labels}
    for word in re.findall(r"[A-Za-z0-9]+", answer):
        if word.casefold() in labels:
            return word.casefold()
    return None


# --------------------------------------------------------------------- DSPy
def run_dspy(task: Task, method: str, budget: int, base_url: str) -> dict[str, Any]:
    import dspy

    lm = dspy.LM(
        "openai/smollm2",
        api_base=base_url,
        api_key="none",
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        # LiteLLM sends the cap as ``max_completion_tokens``, which llama_cpp.server
        # ignores (replies ran to the end of the context); ``max_tokens`` it honours.
        extra_body={"max_tokens": MAX_TOKENS},
        cache=False,
        num_retries=0,
    )
    dspy.configure(lm=lm)

    class BBH(dspy.Signature):
        question: str = dspy.InputField()
        answer: str = dspy.OutputField()

    signature = BBH.with_instructions(task.instructions)
    train, val, test = (
        [dspy.Example(question=x["input"], answer=x["target"]).with_inputs("question") for x in s]
        for s in task.split()
    )

    def metric(example: Any, prediction: Any, trace: Any = None) -> bool:
        return is_correct(getattr(prediction, "answer", ""), example.answer, task)

    program = dspy.Predict(signature)
    started = time.perf_counter()
    calls_before = len(lm.history)
    errors = 0
    if method == "DSPy LabeledFewShot":
        program = dspy.LabeledFewShot(k=4).compile(program, trainset=train)
    elif method == "DSPy BootstrapFewShot":
        optimizer = dspy.BootstrapFewShot(
            metric=metric, max_bootstrapped_demos=4, max_labeled_demos=4
        )
        program = optimizer.compile(program, trainset=train)
    elif method == "DSPy MIPROv2-light":
        optimizer = dspy.MIPROv2(
            metric=metric,
            auto="light",
            num_threads=1,
            max_bootstrapped_demos=4,
            max_labeled_demos=4,
            verbose=False,
        )
        program = optimizer.compile(program, trainset=train, valset=val)
    elif method != "DSPy zero-shot":
        raise ValueError(f"unknown DSPy method {method!r}")
    calls = len(lm.history) - calls_before
    minutes = (time.perf_counter() - started) / 60
    right = lenient = 0
    for example in test:
        try:
            answer = getattr(program(question=example.question), "answer", "")
        except Exception:  # a reply DSPy could not parse counts as wrong
            errors += 1
            continue
        right += is_correct(answer, example.answer, task)
        lenient += first_label(answer, task) == example.answer.casefold()
    demos = [getattr(d, "answer", None) for p in program.predictors() for d in p.demos]
    return {
        "test": right / len(test),
        "calls": calls,
        "minutes": minutes,
        "detail": {
            "instructions": program.predictors()[0].signature.instructions,
            "demos": demos,
            "test_errors": errors,
            "test_lenient": lenient / len(test),
        },
    }


# ----------------------------------------------------------------- TextGrad
def run_textgrad(task: Task, budget: int, base_url: str) -> dict[str, Any]:
    import textgrad as tg
    from openai import OpenAI
    from textgrad.engine.local_model_openai_api import ChatExternalClient

    class Counted(ChatExternalClient):
        """The OpenAI-compatible engine, counting requests, capped in length, never cached."""

        calls = 0

        def _check_cache(self, key: str) -> None:
            return None

        def _save_cache(self, key: str, value: Any) -> None:
            return None

        def _generate_from_single_prompt(self, prompt: str, system_prompt: str | None = None, **kw):
            Counted.calls += 1
            kw["max_tokens"] = min(kw.get("max_tokens", MAX_TOKENS), MAX_TOKENS)
            kw.setdefault("temperature", 0)
            return super()._generate_from_single_prompt(prompt, system_prompt=system_prompt, **kw)

    client = OpenAI(base_url=base_url, api_key="none", max_retries=0)
    engine = Counted(client=client, model_string="smollm2")
    tg.set_backward_engine(engine, override=True)
    train, val, test = task.split()
    system_prompt = tg.Variable(
        task.instructions,
        requires_grad=True,
        role_description="system prompt to a language model that answers the task's questions",
    )
    model = tg.BlackboxLLM(engine, system_prompt=system_prompt)
    optimizer = tg.TextualGradientDescent(engine=engine, parameters=[system_prompt])

    def correct(prediction: Any, ground_truth_answer: Any) -> int:
        return int(is_correct(prediction.value, str(ground_truth_answer.value), task))

    loss_fn = tg.autograd.StringBasedFunction(
        correct, function_purpose="The runtime of a function that checks the answer is correct."
    )

    def accuracy(items: list[dict[str, str]]) -> float:
        right = 0
        for item in items:
            question = tg.Variable(
                item["input"], requires_grad=False, role_description="question to the model"
            )
            with contextlib.suppress(Exception):  # a crashed reply counts as wrong
                right += is_correct(model(question).value, item["target"], task)
        return right / len(items)

    started = time.perf_counter()
    best = accuracy(val)
    steps = crashed = kept = 0
    rng = random.Random(0)
    order = list(train)
    while Counted.calls < budget:
        rng.shuffle(order)
        for start in range(0, len(order), 3):
            if Counted.calls >= budget:
                break
            steps += 1
            previous = system_prompt.value
            try:
                optimizer.zero_grad()
                losses = []
                for item in order[start : start + 3]:
                    question = tg.Variable(
                        item["input"], requires_grad=False, role_description="question to the model"
                    )
                    answer = tg.Variable(
                        item["target"], requires_grad=False, role_description="correct answer"
                    )
                    response = model(question)
                    losses.append(
                        loss_fn(inputs={"prediction": response, "ground_truth_answer": answer})
                    )
                tg.sum(losses).backward()
                optimizer.step()
            except Exception:
                crashed += 1
                system_prompt.set_value(previous)
                continue
            score = accuracy(val)
            if score < best:
                system_prompt.set_value(previous)
            else:
                best, kept = score, kept + 1
    calls = Counted.calls
    minutes = (time.perf_counter() - started) / 60
    return {
        "test": accuracy(test),
        "calls": calls,
        "minutes": minutes,
        "detail": {
            "instructions": system_prompt.value,
            "steps": steps,
            "crashed": crashed,
            "kept": kept,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--method", required=True)
    parser.add_argument("--budget", type=int, default=400)
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    task = TASKS[args.task]
    # DSPy's cache and TextGrad's ./logs go to a directory that is removed afterwards.
    with tempfile.TemporaryDirectory() as home:
        os.environ.setdefault("DSPY_CACHEDIR", home)
        os.chdir(home)
        if args.method == "TextGrad (peer)":
            result = run_textgrad(task, args.budget, args.base_url)
        else:
            result = run_dspy(task, args.method, args.budget, args.base_url)
    print(json.dumps({"task": task.name, "method": args.method, "framework": "peer", **result}))


if __name__ == "__main__":
    main()
