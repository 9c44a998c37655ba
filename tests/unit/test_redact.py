"""Credentials never leave rayline in a printed URI (rayline/redact.py)."""

import pytest

from rayline.redact import MASK, redact_text, redact_uri


@pytest.mark.parametrize("uri, shown", [
    ("postgresql://u:secret@db/mlflow", "postgresql://u:***@db/mlflow"),
    ("postgresql+psycopg://u:secret@db:5432/mlflow", "postgresql+psycopg://u:***@db:5432/mlflow"),
    ("https://user:tok3n@host:5000/x", "https://user:***@host:5000/x"),
    ("https://ghp_tok3n@host/api", "https://***@host/api"),  # a lone user name is usually a token
    ("mysql+pymysql://root:pw%40x@h/db", "mysql+pymysql://root:***@h/db"),
    # a raw '@' or '/' in a password: hidden up to the last '@', never half-shown
    ("postgresql://u:p@ss/w@db/mlflow", "postgresql://u:***@db/mlflow"),
    ("postgresql://u@db/mlflow?password=s3cret&sslmode=require", "postgresql://***@db/mlflow?password=***&sslmode=require"),
    ("postgresql://u@db/mlflow?sslmode=require&password=s3cret", "postgresql://***@db/mlflow?sslmode=require&password=***"),
    ("https://h/m?token=abc&a=b", "https://h/m?token=***&a=b"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Signature=abcd&X-Amz-Credential=AK%2F1&X-Amz-Security-Token=zz",
     "https://b.s3.amazonaws.com/k?X-Amz-Signature=***&X-Amz-Credential=***&X-Amz-Security-Token=***"),
    ("https://acct.blob.core.windows.net/c/m?sv=2020&sig=abc%3D", "https://acct.blob.core.windows.net/c/m?sv=2020&sig=***"),
])
def test_redact_uri_masks_credentials(uri, shown):
    assert redact_uri(uri) == shown


@pytest.mark.parametrize("uri", [
    "sqlite:////home/me/.rayline/mlflow.db",
    "http://127.0.0.1:5000",
    "databricks",
    "file:///tmp/a/mlartifacts/1/abc/artifacts/model",
    "s3://bucket/models/key@v1",  # an '@' in a path is not userinfo
    "mlflow-artifacts:/1/abc/artifacts/model",
])
def test_redact_uri_leaves_uris_without_credentials_alone(uri):
    assert redact_uri(uri) == uri


def test_redact_text_masks_every_uri_in_a_message():
    text = ("cannot open postgresql://u:secret@db/mlflow: (OperationalError) connection to 'https://a:b1c2@host/x' "
            "failed; password='p w' host=db")
    out = redact_text(text)
    assert "secret" not in out and "b1c2" not in out and "p w" not in out
    assert "postgresql://u:***@db/mlflow" in out and "https://a:***@host/x" in out and f"password={MASK}" in out


def test_redact_text_masks_the_secrets_of_known_uris_anywhere():
    # A driver may echo the password alone, or percent-decoded, far from any URI.
    uri = "postgresql://u:p%40ss-w0rd@db/mlflow"
    out = redact_text("auth failed for user u with p@ss-w0rd (p%40ss-w0rd)", uri)
    assert "p@ss-w0rd" not in out and "p%40ss-w0rd" not in out and out.count(MASK) == 2


def test_redact_text_of_plain_text_is_unchanged():
    text = "model 'digits' version 3: not found in sqlite:////w/mlflow.db"
    assert redact_text(text, "sqlite:////w/mlflow.db", None) == text
