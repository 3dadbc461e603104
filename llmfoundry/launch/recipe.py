"""The recipe a cluster job runs: resolved once at submission, with a fixed run name, so that a requeued,
restarted or re-submitted job runs exactly the same training and finds its own checkpoints."""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.core.secrets import (
    MIN_SECRET_LENGTH,
    env_name_for,
    library_variable,
    mask_text,
    remember,
    secret_findings,
)
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
    variable of this environment that an ``${oc.env:...}`` interpolation copied into the recipe. A value that is a
    secret as a whole (by its key or format) is replaced where it was found; a part of a value (a URL's password)
    inside that value; and any secret of 8 characters or more wherever else a string holds it (an interpolation
    may have copied it), in one pass, so that nothing inserted is searched again."""
    findings = secret_findings(recipe)
    remember(finding.secret for finding in findings)  # an error below that quotes one shows it masked
    names: dict[str, str] = {}  # secret -> NAME; a key named like a library's variable (hf_token) names it first
    for finding in sorted(findings, key=lambda f: library_variable(f.path) is None):
        if finding.secret not in names:
            name = env_name_for(finding.secret, finding.path)
            if name in names.values():  # another secret has that name already (e.g. a URL's password and token)
                name = f"{name}_{len(names)}"
            names[finding.secret] = name
    whole = {f.path for f in findings if f.whole}
    parts: dict[str, set[str]] = {}
    for finding in findings:
        parts.setdefault(finding.path, set()).add(finding.secret)
    anywhere = {secret for secret in names if len(secret) >= MIN_SECRET_LENGTH}

    def replace(obj: Any, path: str = "") -> Any:
        if isinstance(obj, dict):
            return {k: replace(v, f"{path}.{k}" if path else str(k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [replace(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
        if path in whole and str(obj) in names:
            reference = f"${{oc.env:{names[str(obj)]}}}"
            return reference if isinstance(obj, str) else f"${{oc.decode:{reference}}}"  # a number stays a number
        if isinstance(obj, str):
            return _substitute(obj, parts.get(path, set()) | anywhere, names)
        return obj

    where: dict[str, str] = {}
    for finding in findings:
        where.setdefault(names[finding.secret], finding.path)
    written = replace(recipe)
    if written.get("run_name") != recipe.get("run_name"):
        raise ConfigError(f"run_name: '{mask_text(str(recipe.get('run_name')))}' holds a secret, and it names the "
                          "job and its folders (choose a run_name without it)")
    return written, {name: secret for secret, name in names.items()}, where


def _substitute(text: str, secrets: set[str], names: dict[str, str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``${oc.env:NAME}`` (longest first, one pass); a backslash just
    before an insertion is doubled, since OmegaConf reads ``\\${`` as an escaped, literal ``${``."""
    present = sorted((secret for secret in secrets if secret in text), key=len, reverse=True)
    if not present:
        return text
    pattern = re.compile("|".join(re.escape(secret) for secret in present))
    pieces, last = [], 0
    for match in pattern.finditer(text):
        before = text[last:match.start()]
        pieces += [before + ("\\" if before.endswith("\\") else ""), f"${{oc.env:{names[match.group(0)]}}}"]
        last = match.end()
    return "".join(pieces) + text[last:]


def recipe_text(recipe: dict) -> str:
    return yaml.safe_dump(recipe, sort_keys=False)


def dns_label(name: str) -> str:
    """``name`` as a Kubernetes / Slurm-friendly label: lower case, [a-z0-9-], at most 63 characters."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"llmfoundry-{label}".rstrip("-")
    return label[:63].rstrip("-")
