"""Mask secrets before a config is logged or saved: API tokens, keys, passwords never leave the process."""

from __future__ import annotations

import re
from typing import Any

MASK = "********"
# Key names that hold credentials: token, api_key, access_key, secret, password, auth, credential(s), ...
_SECRET_KEY = re.compile(r"(token|api[_-]?key|access[_-]?key|secret|passw(or)?d|credential|auth|private[_-]?key)",
                         re.IGNORECASE)
# Key names that match the pattern but hold no secret.
_NOT_SECRET = re.compile(r"(^|_)(max|num|n|pad|bos|eos|unk|sep|cls|mask|special|add|vocab)_?.*token|tokens?$|"
                         r"tokenizer|token_encoding_type|^author", re.IGNORECASE)
# Values that look like credentials whatever their key (e.g. in a free-form kwargs mapping).
_SECRET_VALUE = re.compile(r"^(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|ghp_[A-Za-z0-9]{20,}|"
                           r"xox[bap]-[A-Za-z0-9-]{10,})$")

# Credentials inside a URL: the user info of scheme://user:password@host (or scheme://token@host), and query
# parameters named like credentials (?token=..., &X-Amz-Signature=..., &sig=...).
_URL_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/@\s:]+:[^@\s]+|[^/@\s]+)@")  # a password may hold /
_URL_QUERY = re.compile(r"([?&][^=&#\s]*(?:token|sig|signature|secret|passw|credential|key|auth)[^=&#\s]*=)[^&#\s]+",
                        re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET.search(key)


def mask_secrets(obj: Any, key: str = "") -> Any:
    """A copy of ``obj`` (plain containers) with secret-looking values replaced by ``MASK``."""
    if isinstance(obj, dict):
        return {k: mask_secrets(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mask_secrets(v, key) for v in obj]
    if isinstance(obj, str) and (_SECRET_VALUE.match(obj) or (key and is_secret_key(key) and obj)):
        return MASK
    if isinstance(obj, str) and "://" in obj:
        return mask_url_credentials(obj)
    if key and is_secret_key(key) and isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return MASK
    return obj


def mask_url_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: ``https://user:tok@host/x?sig=abc`` ->
    ``https://********@host/x?sig=********``."""
    return _URL_QUERY.sub(rf"\1{MASK}", _URL_USERINFO.sub(rf"\1{MASK}@", text))
