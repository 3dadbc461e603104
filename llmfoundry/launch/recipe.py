"""The recipe a cluster job runs: resolved once at submission, with a fixed run name, so that a requeued,
restarted or re-submitted job runs exactly the same training and finds its own checkpoints."""

from __future__ import annotations

import os
import re

import yaml

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
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


def recipe_text(recipe: dict) -> str:
    return yaml.safe_dump(recipe, sort_keys=False)


def dns_label(name: str) -> str:
    """``name`` as a Kubernetes / Slurm-friendly label: lower case, [a-z0-9-], at most 63 characters."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"llmfoundry-{label}".rstrip("-")
    return label[:63].rstrip("-")
