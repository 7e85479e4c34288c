"""A DSPy program ported to plait: a sentiment classifier improved with BootstrapFewShot.

`docs/how-to/coming_from_dspy.md` shows the DSPy original beside this file; the
signature, the metric and the optimizer's name are the same, and the few lines
that differ say why in a comment. Runs on the embedded SmolLM2 model (no key,
no network) or on any OpenAI-compatible server:

    python examples/port_from_dspy.py
    python examples/port_from_dspy.py --base-url http://localhost:11434/v1 --model llama3.2

It evaluates the classifier, lets BootstrapFewShot fill its demos from runs the
metric accepts, prints the trials and why the program was kept or changed,
evaluates again and saves the learned demos (``--save``, sentiment.json).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal

import plait
from plait import InputField, OutputField, Predict, Signature
from plait.optimization import BootstrapFewShot


class Sentiment(Signature):
    """Classify the sentiment of a product review."""

    review: str = InputField()
    sentiment: Literal["positive", "negative"] = OutputField()


# DSPy: dspy.Example(review=..., sentiment=...).with_inputs("review"). plait: an
# (inputs, labels) pair; from DSPy examples, (ex.inputs().toDict(), ex.labels().toDict()).
TRAIN = [
    ({"review": "I love this kettle, it boils in a minute."}, {"sentiment": "positive"}),
    ({"review": "Broke after two days. Waste of money."}, {"sentiment": "negative"}),
    ({"review": "Great sound and the battery lasts all week."}, {"sentiment": "positive"}),
    ({"review": "The zip tore the first time I used it."}, {"sentiment": "negative"}),
]
DEV = [
    ({"review": "Excellent knife, still sharp after a year."}, {"sentiment": "positive"}),
    ({"review": "Arrived scratched and the seller never answered."}, {"sentiment": "negative"}),
    ({"review": "My kids love these headphones."}, {"sentiment": "positive"}),
    ({"review": "Too small, and returning it cost more than it did."}, {"sentiment": "negative"}),
    ({"review": "Great value, works exactly as described."}, {"sentiment": "positive"}),
    ({"review": "Stopped charging within a week."}, {"sentiment": "negative"}),
    ({"review": "Comfortable shoes, I love the colour."}, {"sentiment": "positive"}),
    ({"review": "The lid leaks and the handle got hot."}, {"sentiment": "negative"}),
]


def sentiment_match(example: Any, pred: Any, trace: Any = None) -> bool:
    """DSPy's metric, unchanged: plait knows the order by the names example and pred."""
    return example.sentiment == pred.sentiment


def endpoint(base_url: str | None, model: str) -> dict[str, Any]:
    """The one endpoint every call uses (DSPy: dspy.LM(...))."""
    if base_url:
        return {"provider": "openai", "base_url": base_url, "model": model, "api_key": "none"}
    return {"provider": "local"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible server instead of the local model")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--save", type=Path, default=Path("sentiment.json"))
    args = parser.parse_args()

    plait.settings.configure(lm=endpoint(args.base_url, args.model))  # dspy.configure(lm=lm)
    classify = Predict(Sentiment, temperature=0.0)

    optimizer = BootstrapFewShot(sentiment_match, max_demos=2)
    # DSPy returns a compiled copy; plait changes `classify` in place and returns a report.
    report = optimizer.compile(classify, trainset=TRAIN, valset=DEV)
    for trial in report.trials:
        print(f"trial {trial.number}: score {trial.score:.2f} {trial.params} {trial.note}")
    print(f"kept trial {report.best.number}: {report.reason}")

    result = plait.evaluate(classify, DEV, sentiment_match)  # dspy.Evaluate(...)(compiled)
    print(f"dev score: {result:.2f} ({len(result.rows)} examples, {result.calls} calls)")
    classify.save(args.save)  # Predict(Sentiment).load(path) brings the demos back
    print(f"saved {len(classify.demos.value)} demos to {args.save}")


if __name__ == "__main__":
    main()
