"""The demo pipeline on Anthropic's Messages API. Needs a key and the extra.

    pip install 'plait[anthropic]'
    ANTHROPIC_API_KEY=... python examples/anthropic_pipeline.py

The program is the same `Report` as `examples/demo.py`; only the configuration
changes (rpm and max_concurrent hold across every call of a batch).
"""

from __future__ import annotations

from demo import TEXT, Report

from plait import ResourceConfig


def main() -> None:
    resources = ResourceConfig(
        {
            "llm": {
                "provider": "anthropic",
                "model": "claude-haiku-4-5",
                "api_key_env": "ANTHROPIC_API_KEY",
                "max_concurrent": 8,
                "rpm": 50,
            },
        }
    )
    report = Report().bind(resources)
    result = report.run_sync(TEXT)
    for name, answer in result.items():
        print(f"[{name}]\n{answer.strip()}\n")


if __name__ == "__main__":
    main()
