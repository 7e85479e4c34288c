"""Credentials inside URLs: masked for display, scrubbed from foreign text, split off for auth."""

from __future__ import annotations

import pytest

from plait.backends._urls import (
    RedactedError,
    basic_authorization,
    join_path,
    redact_url,
    scrub_cause,
    scrub_text,
    split_credentials,
    without_addresses,
)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:s3cret@host/v1", "https://***:***@host/v1"),
        ("https://tok3n-abc@host/v1", "https://***@host/v1"),
        ("https://host/v1?api-version=2024-06&api-key=s3cret", "https://host/v1?api-version=2024-06&api-key=***"),
        ("https://host/v1?KEY=a&Token=b&access_token=c&sig=d&apikey=e&api_key=f&x=1",
         "https://host/v1?KEY=***&Token=***&access_token=***&sig=***&apikey=***&api_key=***&x=1"),
        ("https://host/v1?client_secret=a&Password=b#access_token=c",
         "https://host/v1?client_secret=***&Password=***#access_token=***"),
        ("http://u:pa/ss@host/v1", "http://***:***@host/v1"),  # an unescaped "/" in the password
        ("user:s3cret@host/v1", "***:***@host/v1"),  # no scheme: still masked
        ("http://[::1", "http://[::1"),  # unparseable: returned, never raised
        ("https://host/v1", "https://host/v1"),
    ],
)  # fmt: skip
def test_redact_url_masks_user_info_and_credential_query_values(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_scrub_text_masks_the_url_and_each_credential_in_any_spelling() -> None:
    url = "http://me:s3cr3t%2Dx@host/v1?api-key=k3y-value"
    text = f"failed for {url}; again for http://host/v1?api-key=k3y-value; password s3cr3t-x"
    clean = scrub_text(text, url)
    assert "s3cr3t" not in clean and "k3y-value" not in clean
    assert clean.startswith("failed for http://***:***@host/v1?api-key=***;")
    assert scrub_text("nothing secret", None) == "nothing secret"


def test_scrub_cause_replaces_only_exceptions_whose_text_holds_a_credential() -> None:
    url = "http://host/v1?token=t0k3n-value"
    inner = OSError(f"refused by {url}")
    outer = ValueError("wrapped")
    outer.__cause__ = inner
    clean = scrub_cause(outer, url)
    assert clean is outer  # its own text is clean: kept, with a clean cause
    assert isinstance(clean.__cause__, RedactedError)
    assert str(clean.__cause__) == "builtins.OSError: refused by http://host/v1?token=***"
    plain = KeyError("x")
    assert scrub_cause(plain, url) is plain


def test_split_credentials_takes_the_login_out_of_the_url() -> None:
    url, login = split_credentials("http://us%40er:p%2Fw@h:1/v1?api-key=x")
    assert (url, login) == ("http://h:1/v1?api-key=x", ("us@er", "p/w"))
    assert split_credentials("http://h/v1?a=b@c") == ("http://h/v1?a=b@c", None)
    assert basic_authorization("Aladdin", "open sesame") == "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="


def test_join_path_puts_the_path_before_the_query() -> None:
    base = "https://x.azure.com/openai/v1/?api-version=1"
    assert join_path(base, "/chat/completions") == (
        "https://x.azure.com/openai/v1/chat/completions?api-version=1"
    )
    assert join_path("http://h/v1", "/chat/completions") == "http://h/v1/chat/completions"


@pytest.mark.parametrize(
    ("text", "told"),
    [
        (
            "endpoint http://me:s3cret@10.0.0.5:8080/v1?api-key=k (model 'm') answered HTTP 500.",
            "endpoint <address> (model 'm') answered HTTP 500.",
        ),
        (
            "Cannot connect to host 127.0.0.1:9 ssl:default [Connect call failed ('127.0.0.1', 9)]",
            "Cannot connect to host <address> ssl:default [Connect call failed ('<address>', 9)]",
        ),
        ("api.internal.example:8443 refused; see https://x.example/doc.", "<address> refused; "
         "see <address>."),
        ("[::1]:8000 is down", "<address> is down"),
        ("ValueError: x must not be negative at 12:30 in v3.11", "ValueError: x must not be "
         "negative at 12:30 in v3.11"),
    ],
)  # fmt: skip
def test_without_addresses_keeps_the_reason_and_drops_where_it_went(text: str, told: str) -> None:
    assert without_addresses(text) == told
