"""`llmfoundry check RECIPE.yaml [overrides]`: validate a train or eval recipe and say, key by key, what it does
here that differs from llm-foundry, without running anything.

For people bringing llm-foundry recipes: each key the recipe sets whose behaviour here differs from llm-foundry's
is listed with what it does here (the ``differs=`` note of its ``option``); a key that cannot work here is a
validation error, listed with every other problem. Exit code 0 when the recipe validates, 2 when it does not.
An eval recipe is recognised by its ``models`` list.
"""

from __future__ import annotations

import argparse

from llmfoundry.config.load import load_config
from llmfoundry.commands.eval import validate_eval_recipe
from llmfoundry.config.notes import recipe_notes
from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import EvalConfig
from llmfoundry.registry import import_code_paths
from llmfoundry.train.recipe import TrainConfig, validate


def check_recipe(path: str, overrides: list[str]) -> tuple[str, list[tuple[str, str]], list[str]]:
    """(kind of recipe, (key, note) differences from llm-foundry, validation problems) for the recipe at ``path``."""
    is_eval = "models" in load_config(path, overrides)
    schema = EvalConfig if is_eval else TrainConfig
    plain = load_config(path, overrides, schema)
    problems: list[str] = []
    try:
        if is_eval:
            validate_eval_recipe(plain)
        else:
            import_code_paths(plain.get("code_paths"))
            validate(plain, TrainConfig)
    except ConfigError as error:
        problems = error.problems
    notes = recipe_notes(plain, schema)
    return ("eval" if is_eval else "train"), notes, problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry check", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="path of a train or eval YAML recipe")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as for llmfoundry train/eval")
    args = parser.parse_args(argv)
    kind, notes, problems = check_recipe(args.recipe, args.overrides)
    if notes:
        print(f"{args.recipe}: {len(notes)} key(s) behave differently from llm-foundry:")
        for key, note in notes:
            print(f"  - {key}: {note}")
    else:
        print(f"{args.recipe}: every key it sets behaves as in llm-foundry")
    if problems:
        print(f"{args.recipe}: not a valid {kind} recipe here ({len(problems)} problem(s)):")
        for problem in problems:
            print(f"  - {problem}")
        return 2
    print(f"{args.recipe}: valid {kind} recipe")
    return 0
