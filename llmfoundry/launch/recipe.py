"""The recipe a cluster job runs: resolved once at submission, with a fixed run name, so that a requeued,
restarted or re-submitted job runs exactly the same training and finds its own checkpoints."""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.core.secrets import env_name_for, find_secrets, library_variable
from llmfoundry.train.run_name import generate_run_name, given_run_name


def resolved_recipe(plain: dict, key_prefix: str = "", run_name: str | None = None,
                    require_save_folder: bool = True) -> dict:
    """``plain`` (the resolved, validated recipe) ready to travel with a job: run_name fixed (``run_name`` wins
    over the recipe's), autoresume on. Without ``require_save_folder``, a recipe with no save_folder travels as it
    is (a restart starts over; the caller says so).

    The run's identity never depends on the job id: the same save_folder on every requeue and re-submission."""
    recipe = dict(plain)
    if run_name:
        recipe["run_name"] = run_name
    if not recipe.get("save_folder") and not require_save_folder:
        recipe["run_name"] = given_run_name(recipe.get("run_name"), os.environ) or generate_run_name()
        return recipe
    if not recipe.get("save_folder"):
        raise ConfigError(f"{key_prefix}save_folder: not set, so a requeued or restarted job would start over "
                          "(set save_folder to a folder every node can reach, or an s3:// URL)")
    given = given_run_name(recipe.get("run_name"), os.environ)
    if given is None and "{run_name}" in str(recipe["save_folder"]):
        raise ConfigError(f"{key_prefix}run_name: not set while save_folder '{recipe['save_folder']}' contains "
                          "{run_name}, so submitting again would look in a new folder (set run_name)")
    recipe["run_name"] = given or generate_run_name()
    if not recipe.get("autoresume"):
        notice_once("autoresume: set to true in the submitted recipe, so that a requeued or restarted job resumes "
                    "from the newest complete checkpoint in save_folder")
        recipe["autoresume"] = True
    return recipe


def secrets_to_env(recipe: dict) -> tuple[dict, dict[str, str], dict[str, str]]:
    """``recipe`` with every secret it holds replaced by ``${oc.env:NAME}``, so that the job reads it from its own
    environment; returns (that recipe, {NAME: secret value}, {NAME: the recipe key where it was found}).

    A secret is what the log masking treats as one (core/secrets.py), including the value of a credential
    variable of this environment that an ``${oc.env:...}`` interpolation copied into the recipe."""
    env: dict[str, str] = {}
    where: dict[str, str] = {}
    names: dict[str, str] = {}  # secret value -> NAME
    found = find_secrets(recipe).items()
    # a key named like a library's variable (hf_token -> HF_TOKEN) gets that name before a value merely copied from it
    for value, path in sorted(found, key=lambda item: library_variable(item[1]) is None):
        name = env_name_for(value, path)
        if env.get(name, value) != value:  # another secret already has that name (e.g. a URL's user and token)
            name = f"{name}_{len(env)}"
        env[name], where[name], names[value] = value, path, name
    ordered = sorted(names, key=len, reverse=True)  # a secret inside another is replaced whole

    def replace(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: replace(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [replace(v) for v in obj]
        if isinstance(obj, (int, float)) and not isinstance(obj, bool) and str(obj) in names:
            return f"${{oc.env:{names[str(obj)]}}}"
        if isinstance(obj, str):
            for value in ordered:
                obj = obj.replace(value, f"${{oc.env:{names[value]}}}")
        return obj

    return replace(recipe), env, where


def recipe_text(recipe: dict) -> str:
    return yaml.safe_dump(recipe, sort_keys=False)


def dns_label(name: str) -> str:
    """``name`` as a Kubernetes / Slurm-friendly label: lower case, [a-z0-9-], at most 63 characters."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"llmfoundry-{label}".rstrip("-")
    return label[:63].rstrip("-")
