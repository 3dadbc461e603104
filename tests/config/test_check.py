"""`llmfoundry check`: validates a recipe without running it and lists what its keys do differently here."""

from __future__ import annotations

import textwrap

import yaml

from llmfoundry import registry
from llmfoundry.cli import main as cli_main

PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass

    from llmfoundry import registry
    from llmfoundry.config.fields import option


    @dataclass
    class NoteSettings:
        every: int = option(1, "how often", differs="counts optimizer steps here, not microbatches")
        plain: int = option(0, "behaves as in llm-foundry")


    @registry.callbacks.register("check_test_note", config=NoteSettings)
    def build(settings):
        raise AssertionError("llmfoundry check must not build anything")
''')


def _recipe(tmp_path, **changes) -> str:
    recipe = yaml.safe_load(open("yamls/mpt/125m.yaml"))
    recipe.update(changes)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def test_check_lists_the_differences_of_the_keys_a_recipe_sets_without_building_anything(tmp_path, capsys):
    plugin = tmp_path / "note_plugin.py"
    plugin.write_text(PLUGIN)
    try:
        path = _recipe(tmp_path, code_paths=[str(plugin)], callbacks={"check_test_note": {"every": 2, "plain": 1}})
        assert cli_main(["check", path]) == 0
        out = capsys.readouterr().out
        assert "callbacks.check_test_note.every: counts optimizer steps here, not microbatches" in out
        assert "callbacks.check_test_note.plain" not in out  # no note: behaves as in llm-foundry
        assert "valid train recipe" in out
        # a key left at its default is not listed
        assert cli_main(["check", _recipe(tmp_path, code_paths=[str(plugin)], callbacks={"check_test_note": {}})]) == 0
        assert "every key it sets behaves as in llm-foundry" in capsys.readouterr().out
    finally:
        registry.callbacks._entries.pop("check_test_note", None)


def test_check_reports_every_problem_and_exits_2(tmp_path, capsys):
    path = _recipe(tmp_path, max_duraton="10ba", global_train_batch_size="x")
    assert cli_main(["check", path, "model.n_layer=2"]) == 2
    out = capsys.readouterr().out
    assert "not a valid train recipe here (3 problem(s))" in out
    for expected in ("max_duraton: unknown key (did you mean 'max_duration'?)", "global_train_batch_size: expected an int",
                     "model.n_layer: unknown key (did you mean 'model.n_layers'?)"):
        assert expected in out


def test_check_recognises_an_eval_recipe(capsys):
    assert cli_main(["check", "yamls/eval/gauntlet.yaml"]) == 0
    assert "valid eval recipe" in capsys.readouterr().out


def test_check_names_a_registered_name_that_llm_foundry_lacks(capsys):
    assert cli_main(["check", "yamls/mpt/125m.yaml", "optimizer.name=adamw"]) == 0
    assert "optimizer.name=adamw: llm-foundry has no 'adamw' optimizer" in capsys.readouterr().out
