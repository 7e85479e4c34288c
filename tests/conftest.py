"""Suite-wide guards: no test may write the user's cache or call a paid cloud endpoint."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Points plait's default response-cache directory at a temporary folder."""
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path_factory.mktemp("plait-cache")))


@pytest.fixture(autouse=True)
def _no_cloud_keys(monkeypatch: pytest.MonkeyPatch):
    """Removes provider keys, so a test that reaches a real cloud endpoint fails at once."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
