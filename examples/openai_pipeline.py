"""The demo pipeline on OpenAI (or any OpenAI-compatible server). Needs a key.

    OPENAI_API_KEY=... python examples/openai_pipeline.py
    # any compatible server, e.g. vLLM or Ollama:
    PLAIT_BASE_URL=http://localhost:11434/v1 PLAIT_MODEL=llama3.2 python examples/openai_pipeline.py

The program is the same `Report` as `examples/demo.py`; only the configuration
changes. Limits hold per endpoint across the whole batch.
"""

from __future__ import annotations

import os

from demo import TEXT, Report

from plait import ResourceConfig
from plait.report.profiling import profile


def main() -> None:
    endpoint = {
        "provider": "openai",
        "model": os.environ.get("PLAIT_MODEL", "gpt-4o-mini"),
        "api_key_env": "OPENAI_API_KEY",
        "max_concurrent": 16,
        "rpm": 500,
        "max_retries": 4,
        "timeout": 60,
    }
    if "PLAIT_BASE_URL" in os.environ:
        endpoint["base_url"] = os.environ["PLAIT_BASE_URL"]
        endpoint.setdefault("api_key", os.environ.get("OPENAI_API_KEY", "unused"))
        del endpoint["api_key_env"]
    report = Report().bind(ResourceConfig({"llm": endpoint}))
    with profile() as prof:
        result = report.run_sync(TEXT)
    for name, answer in result.items():
        print(f"[{name}]\n{answer.strip()}\n")
    print(prof.table())


if __name__ == "__main__":
    main()
