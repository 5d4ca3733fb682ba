"""The hooks' masking: every kind docs/secrets.md lists, the token in use, and text left as it
was. The scanner itself is tested in tests/storage/core/test_secret_scan.py."""

from __future__ import annotations

import json

import pytest
from project_memory_client.agents.secrets import mask, mask_value
from project_memory_client.secret_scan import default_rules

SAMPLES = {
    "private-key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "project-memory-token": "pm_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v",
    "anthropic-key": "sk-ant-api03-" + "x" * 40,
    "openai-key": "sk-proj-" + "Ab3" * 15,
    "aws-access-key": "AKIA" + "ABCDEFGHIJKLMNOP",
    "github-token": "ghp_" + "a" * 36,
    "gitlab-token": "glpat-" + "b" * 20,
    "slack-token": "xoxb-1234567890-abcdefghij",
    "google-api-key": "AIza" + "c" * 35,
    "stripe-key": "sk_live_" + "d" * 24,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer-token": "Authorization: Bearer abcdefghijklmnopqrstuvwx",
    "basic-auth": "Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==",
    "url-password": "postgres://app:s3cretpass@db.internal:5432/app",
    "secret-assignment": 'DB_PASSWORD="correct-horse-battery"',
}


def test_every_sample_is_a_kind_of_the_rules() -> None:
    assert set(SAMPLES) <= set(default_rules().kinds)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_each_pattern_is_masked(kind: str) -> None:
    text = f"before {SAMPLES[kind]} after"
    out = mask(text)
    assert f"[secret:{kind}]" in out, out
    assert out.startswith("before ") and out.endswith(" after")
    secret_part = SAMPLES[kind].split()[-1].split("@")[0][-12:]
    assert secret_part not in out


def test_the_token_in_use_is_masked_whatever_its_shape() -> None:
    assert (
        mask("use tok-1234567890 here", ["tok-1234567890"])
        == "use [secret:project-memory-token] here"
    )
    assert mask("short abc", ["abc"]) == "short abc"  # too short to be a secret worth a false hit


def test_ordinary_text_is_left_alone() -> None:
    text = (
        "The token bucket refills; set the password field in the form. See sk-learn and"
        " https://example.com/a:b. Bearer of bad news. A 40-char sha: " + "0" * 40
    )
    assert mask(text) == text


def test_values_are_masked_deep() -> None:
    value = {"a": [SAMPLES["github-token"], 3, None], "b": {"c": SAMPLES["jwt"]}}
    out = mask_value(value)
    assert out == {"a": ["[secret:github-token]", 3, None], "b": {"c": "[secret:jwt]"}}


# Formats that once reached the server through the hooks, each with the part that must go.
GOT_THROUGH = {
    "npm": ("//registry.npmjs.org/:_authToken=npm_" + "a1B2c3" * 6, "a1B2c3" * 6),
    "pypi": ("password = pypi-AgEIcHlwaS5vcmc" + "Qm9vaw" * 10, "Qm9vaw" * 10),
    "huggingface": ("HF_TOKEN hf_" + "AbCdEfGhIj" * 3 + "KlMn", "AbCdEfGhIj" * 3),
    "slack app": ("xapp-1-A0B1C2D3E4-1234567890123-" + "ab12" * 16, "ab12" * 16),
    "slack webhook": (
        "https://hooks.slack.com/services/T0ABCDEFG/B0HIJKLMNO/" + "aB3dE6" * 4,
        "aB3dE6" * 4,
    ),
    "redis, empty user": ("redis://:Sup3rS3cretPass@cache:6379/0", "Sup3rS3cretPass"),
    "curl -u": ("curl -u admin:Pr1vateP4ss https://ci.example", "Pr1vateP4ss"),
    "PEM cut short": (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\nAAAA",
        "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
    ),
    "token in base64": ("Z2hwXzFhMkIzYzRENWU2RjdnOGg5STBqMUsybDNNNG41TzZwN1E=", "Z2hwXzFhMkIz"),
    "token in hex": ("676c7061742d61624364334566476836694a6b4c6d4e6f507131", "676c7061742d"),
}


@pytest.mark.parametrize("name", sorted(GOT_THROUGH))
def test_what_got_through_before_is_masked_plain_and_json_escaped(name: str) -> None:
    text, secret = GOT_THROUGH[name]
    assert secret not in mask(f"said: {text} ok")
    # A transcript line: the text after a JSON \n or \t, or quoted.
    for line in (
        json.dumps({"content": f"output:\n{text}\tdone"}),
        json.dumps({"content": {"value": text}}),
    ):
        masked = mask(line)
        assert secret not in masked and "[secret:" in masked, masked
        json.loads(masked)
