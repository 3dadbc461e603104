"""Secrets never leave the process: what counts as one, and masking it wherever text is written.

A value is a secret when its key looks like one (token, api_key, password, ...), when it has a known token format
(``hf_...``, ``sk-...``, ``AKIA...``), when it is the credential part of a URL (``scheme://user:pass@host``,
``?token=``, ``X-Amz-Signature=``), or when it is the value of an environment variable that holds credentials
(``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``WANDB_API_KEY``, ... and any variable named like a secret). Secret
values found in a recipe are remembered for the process (``remember``), so that text quoting them later (an error
message, a notice, a console line) is masked too (``mask_text``).

The launchers use ``secret_findings`` to keep secrets out of what they write: each one becomes an environment
variable of the job (``env_name_for``), and the recipe reads it back with ``${oc.env:NAME}``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

MASK = "********"
# Key names that hold credentials: token, api_key, access_key, secret, password, auth, credential(s), ...
_SECRET_KEY = re.compile(r"(token|api[_-]?key|access[_-]?key|account[_-]?key|private[_-]?key|secret|passw(or)?d|"
                         r"credential|auth|connection[_-]?string)", re.IGNORECASE)
# Key names that match the pattern but hold no secret: special tokens and their ids (pad_token, eos_token_id,
# decoder_start_token_id), plural "tokens" (counts and lists), the tokenizer, authors. The prefix words are whole
# segments, so neptune_api_token or endpoint_token stay secret.
_NOT_SECRET = re.compile(r"(^|_)(max|num|n|pad|bos|eos|unk|sep|cls|mask|special|add|vocab|start|end|stop)"
                         r"(_[a-z]+)*_tokens?(_ids?)?$|tokens|(^|_)token_?(type_)?ids?$|tokenizer|"
                         r"token_encoding_type|^author", re.IGNORECASE)
# Values that look like credentials whatever their key (e.g. in a free-form kwargs mapping), and the same formats
# inside longer text.
_TOKEN_FORMATS = r"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|ghp_[A-Za-z0-9]{20,}|xox[bap]-[A-Za-z0-9-]{10,}"
_SECRET_VALUE = re.compile(rf"^({_TOKEN_FORMATS})$")
_TOKEN_IN_TEXT = re.compile(rf"(?<![A-Za-z0-9_-])({_TOKEN_FORMATS})(?![A-Za-z0-9_-])")

# Credentials inside a URL: the user info of scheme://user:password@host (a bare scheme://name@host, as OCI's
# bucket@namespace or ssh's git@host, is no credential), and query parameters whose whole name ends in a credential
# word (?token=, &sig=, &X-Amz-Signature=, &api_key=; not ?author= or ?design=).
# A password may hold "/" (S3 secret keys do); host:port/path...@ is not user:password@.
_URL_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^/@\s:]+:(?!\d+(?:/|$))[^@\s]+)@")
_URL_PASSWORD = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s:]+:(?!\d+(?:/|$))([^@\s]+)@")
_URL_QUERY = re.compile(r"([?&](?:[^=&#\s]*[_-])?(?:token|sig|signature|secret|passw(?:or)?d|credential|key|apikey|"
                        r"auth|sas)=)([^&#\s]+)", re.IGNORECASE)

# The credential fields of a connection string (Azure Storage's AccountKey= and SharedAccessSignature=, Event
# Hubs' SharedAccessKey=), wherever the string is quoted: ``...;AccountKey=<key>;BlobEndpoint=...``.
_CONNECTION_STRING = re.compile(r"(\b(?:AccountKey|SharedAccessSignature|SharedAccessKey)=)([^;\s'\"]+)",
                                re.IGNORECASE)

# Environment variables the libraries we run read credentials from (besides any variable named like a secret).
SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "AWS_ACCESS_KEY_ID",
                   "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN",
                   "MLFLOW_TRACKING_PASSWORD", "DATABRICKS_TOKEN", "DATABRICKS_CLIENT_SECRET", "OPENAI_API_KEY",
                   "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN",
                   "OCI_CLI_KEY_CONTENT", "OCI_S3_ACCESS_KEY_ID", "OCI_S3_SECRET_ACCESS_KEY",
                   "GOOGLE_APPLICATION_CREDENTIALS_JSON", "COMET_API_KEY", "NEPTUNE_API_TOKEN")
# Shorter values are not searched for in text: masking every "1" or "true" would garble the output, and a value
# that short is no credential.
MIN_SECRET_LENGTH = 8

_remembered: set[str] = set()
_known: tuple[Any, list[str]] = (None, [])  # (what it was computed from, known_secrets()): mask_text runs per write


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET.search(key)


def is_secret_env_var(name: str) -> bool:
    return name in SECRET_ENV_VARS or is_secret_key(name)


def secret_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables of ``environ`` (default: this process's) that hold credentials."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if is_secret_env_var(name) and len(value) >= MIN_SECRET_LENGTH}


def remember(values) -> None:
    """Mask these values wherever ``mask_text`` sees them from now on in this process."""
    _remembered.update(v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_LENGTH)


def known_secrets() -> list[str]:
    """Every secret value this process knows of, longest first (so a value inside another is masked whole);
    computed again only when the environment or the remembered values changed."""
    global _known
    source = (frozenset(os.environ.items()), len(_remembered))
    if _known[0] != source:
        _known = (source, sorted(_remembered | set(secret_env().values()), key=len, reverse=True))
    return _known[1]


def mask_text(text: str) -> str:
    """``text`` with every known secret value, token-formatted string and URL credential replaced by ``MASK``."""
    for value in known_secrets():
        if value in text:
            text = text.replace(value, MASK)
    return mask_url_credentials(_TOKEN_IN_TEXT.sub(MASK, text))


def mask_url_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: ``https://user:tok@host/x?sig=abc`` ->
    ``https://********@host/x?sig=********``."""
    text = _CONNECTION_STRING.sub(rf"\1{MASK}", text)
    return _URL_QUERY.sub(rf"\1{MASK}", _URL_USERINFO.sub(rf"\1{MASK}@", text))


def _whole_secret(value: Any, key: str, under_secret: bool) -> bool:
    """Whether a leaf value is a secret as a whole: under a secret-looking mapping, by its own key, or by format."""
    if under_secret and value not in (None, "") and not isinstance(value, bool):
        return True
    if isinstance(value, str):
        return bool(value) and bool(_SECRET_VALUE.match(value) or (key and is_secret_key(key)))
    return bool(key) and is_secret_key(key) and isinstance(value, (int, float)) and not isinstance(value, bool)


def mask_secrets(obj: Any, key: str = "", under_secret: bool = False) -> Any:
    """A copy of ``obj`` (plain containers) with secret values replaced by ``MASK`` (every value of a mapping under
    a secret-looking key too: ``credentials: {account_key: ...}``)."""
    if isinstance(obj, dict):
        return {k: mask_secrets(v, str(k), under_secret or is_secret_key(str(k))) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mask_secrets(v, key, under_secret) for v in obj]
    if _whole_secret(obj, key, under_secret):
        return MASK
    if isinstance(obj, str):
        return mask_text(obj)
    return obj


def mask_argv(argv: list[str]) -> list[str]:
    """A command line with its secrets masked: ``key=value`` overrides whose key looks secret, then the text rules."""
    masked = []
    for arg in argv:
        key, value = _split_override(arg)
        if value and is_secret_key(key):
            arg = arg[:len(arg) - len(value)] + MASK
        masked.append(mask_text(arg))
    return masked


def _walk(obj: Any, path: str = "", key: str = "", secret_parent: bool = False
          ) -> Iterator[tuple[str, str, Any, bool]]:
    """(dotted path, key, value, under a secret-named key) of every leaf of plain containers."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k), str(k), secret_parent or is_secret_key(str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}.{i}" if path else str(i), key, secret_parent)
    else:
        yield path, key, obj, secret_parent


@dataclass(frozen=True)
class Finding:
    path: str  # the recipe key (dotted) of the value that holds the secret
    secret: str
    whole: bool  # the whole value is the secret (its key, a token format); else a part of it (a URL's password)


def secret_findings(obj: Any, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Every secret in a plain recipe: values under secret-looking keys (a mapping under such a key included),
    token formats, URL credentials (the credential alone) and values of the credential environment variables."""
    env_values = set(secret_env(environ).values())
    found: list[Finding] = []
    for path, key, value, secret_parent in _walk(obj):
        if _whole_secret(value, key, secret_parent):
            found.append(Finding(path, str(value), True))
            continue
        if not isinstance(value, str):
            continue
        parts = [m.group(1) for m in _URL_PASSWORD.finditer(value)]
        parts += [m.group(2) for m in _URL_QUERY.finditer(value)]
        parts += [m.group(2) for m in _CONNECTION_STRING.finditer(value)]
        parts += [m.group(1) for m in _TOKEN_IN_TEXT.finditer(value)]
        parts += [env_value for env_value in env_values if env_value in value]
        found += [Finding(path, part, part == value) for part in dict.fromkeys(parts)]
    return found


def find_secrets(obj: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """{secret value: dotted path where it was first found} of ``secret_findings``."""
    found: dict[str, str] = {}
    for finding in secret_findings(obj, environ):
        found.setdefault(finding.secret, finding.path)
    return found


def env_name_for(value: str, path: str, environ: Mapping[str, str] | None = None) -> str:
    """The environment variable a job reads the secret ``value`` (found at ``path``) from: the library's own variable
    named like its key (``variables.hf_token`` -> ``HF_TOKEN``), the credential variable that holds it here, or
    ``LLMFOUNDRY_SECRET_<PATH>``."""
    named = library_variable(path)
    if named:
        return named
    for name, env_value in secret_env(environ).items():
        if env_value == value and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):  # a name a shell can expand
            return name
    return "LLMFOUNDRY_SECRET_" + re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_").upper()


def library_variable(path: str) -> str | None:
    """``HF_TOKEN`` for a key such as ``variables.hf_token``: a credential variable a library reads, named like the
    key, or None."""
    key = re.sub(r"[^A-Za-z0-9]+", "_", path.rsplit(".", 1)[-1]).upper()
    return key if key in SECRET_ENV_VARS else None


class MaskedStream:
    """A text stream (sys.stdout, sys.stderr) whose writes are masked with ``mask_text``.

    Whatever later replaces its ``write`` (wandb patches ``write`` to capture the console into its run file) is
    handed masked text too: assigning ``write`` wraps the new function in the same masking."""

    def __init__(self, stream):
        object.__setattr__(self, "_stream", stream)
        object.__setattr__(self, "write", _masking(stream.write))

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, _masking(value) if name == "write" else value)

    def __getattr__(self, name: str) -> Any:
        if name == "_stream":  # looked up before __init__ ran (copy.copy): not there yet
            raise AttributeError(name)
        return getattr(self._stream, name)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)


def _masking(write):
    if getattr(write, "masks_secrets", False):  # already ours (wandb putting back the write it replaced)
        return write

    def masked_write(text):
        if isinstance(text, str):
            write(mask_text(text))
            return len(text)
        return write(text)
    masked_write.masks_secrets = True
    return masked_write


def protect_process(argv: list[str]) -> None:
    """Keep this process's secrets out of what it writes: the secret values of ``argv`` (the command's arguments)
    are remembered, ``sys.argv`` (which wandb, MLflow and Ray record) is masked, and so are stdout and stderr."""
    remember(value for arg in argv for value in find_secrets(_override_as_mapping(arg)))
    sys.argv[:] = mask_argv(sys.argv)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, MaskedStream):
            setattr(sys, name, MaskedStream(stream))


def _split_override(arg: str) -> tuple[str, str | None]:
    """(last key of the path, value) of a ``[+|++|~]a.b=value`` override; ("", None) for any other argument."""
    key, sep, value = arg.lstrip("+~").partition("=")
    return (key.rsplit(".", 1)[-1], value) if sep else ("", None)


def _override_as_mapping(arg: str) -> dict[str, Any]:
    """``{key: value}`` of a ``key=value`` override, a flow value (``variables={api_key: x}``) read as YAML;
    ``{"": arg}`` for any other argument."""
    key, value = _split_override(arg)
    if value is None:
        return {"": arg}
    if value.lstrip()[:1] in ("{", "["):
        try:
            return {key: yaml.safe_load(value)}
        except yaml.YAMLError:
            pass  # the recipe loader reports it; its text is still searched as it is
    return {key: value}
