"""A token planted in every way a user can give one, and a search of every byte a run or a command wrote.

The tokens have no known token format (no ``hf_`` prefix), so only the key rules, the URL rules and the credential
environment variables can keep them out: a test that passes on these passes because of those rules."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Planted:
    tokens: dict[str, str]  # how it was given -> the token
    variables: dict[str, str]  # for the recipe's `variables` section
    overrides: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def recipe(self, recipe: dict) -> dict:
        recipe = dict(recipe)
        recipe["variables"] = {**recipe.get("variables", {}), **self.variables}
        return recipe


def plant() -> Planted:
    tokens = {how: f"planted{how}{uuid.uuid4().hex}" for how in
              ("override", "recipe", "interpolation", "env", "envaws", "url")}
    return Planted(
        tokens=tokens,
        variables={"api_key": tokens["recipe"],  # a recipe value under a secret-looking key
                   "service_note": "${oc.env:MY_SERVICE_TOKEN}",  # interpolated from a secret-named variable
                   "hub_note": "${oc.env:HF_TOKEN}",  # a library's credential variable, under a plain key
                   "mirror": f"https://someone:{tokens['url']}@example.com/data"},  # credentials in a URL
        overrides=[f"+variables.hf_token={tokens['override']}"],
        env={"MY_SERVICE_TOKEN": tokens["interpolation"], "HF_TOKEN": tokens["env"],
             "AWS_SECRET_ACCESS_KEY": tokens["envaws"]})


def leaks(tokens, *roots: Path, texts: dict[str, str] | None = None) -> list[str]:
    """'<file or text>: <token>' for every token found in a file under ``roots`` or in ``texts``."""
    found = []
    for root in roots:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
        for path in files:
            data = path.read_bytes()
            found += [f"{path}: {token}" for token in tokens if token.encode() in data]
    for name, text in (texts or {}).items():
        found += [f"{name}: {token}" for token in tokens if token in text]
    return found


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]
