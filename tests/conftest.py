"""Suite-wide guards: no test may write the user's cache or call a paid cloud endpoint.

Also the ``--fuzz-long`` option of the fuzz suite (tests/fuzz), which pytest only
accepts from the conftest at the root of the tests.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["postgres_server"]  # the real PostgreSQL server of the state tests


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Points plait's default response-cache directory at a temporary folder."""
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path_factory.mktemp("plait-cache")))


@pytest.fixture(autouse=True)
def _no_cloud_keys(monkeypatch: pytest.MonkeyPatch):
    """Removes provider keys, so a test that reaches a real cloud endpoint fails at once."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        help="Run tests/fuzz deeply: many more inputs per parser, randomly (PLAIT_FUZZ_LONG=1).",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Read by tests/fuzz/support.py when the fuzz tests are imported, after this hook.
    if config.getoption("--fuzz-long"):
        os.environ["PLAIT_FUZZ_LONG"] = "1"
