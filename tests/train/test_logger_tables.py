"""Tables from callbacks (generate_callback here) reach every logger that records tables, read back from what
each one wrote: the jsonl file, the in-memory logger, wandb's offline run files, MLflow's file store, tensorboard's
events."""

from __future__ import annotations

import json
from pathlib import Path

from llmfoundry.train.callbacks.generate import Generate
from llmfoundry.train.loggers.in_memory import InMemoryLogger
from tests.helpers import make_trainer
from tests.train.test_logger_keys import file_store, mlflow_runs, offline_run  # noqa: F401 (file_store: a fixture)

COLUMNS = ["prompt", "generation"]


def generate_recipe(recipe, loggers: dict, **overrides) -> dict:
    generate = {"prompts": ["the quick", "a"], "interval": "1ba", "max_new_tokens": 3, "do_sample": False}
    return recipe(eval_loader=None, max_duration="2ba", loggers=loggers,
                  callbacks={"generate_callback": generate}, **overrides)


def generations(trainer) -> list[list[str]]:
    """The last table the generate callback logged (rank 0 keeps it)."""
    (callback,) = [cb for cb in trainer.callbacks if isinstance(cb, Generate)]
    assert len(callback.rows) == 2
    return callback.rows


def history(records) -> list[dict]:
    """wandb's history rows; a logged object (a table) is a dict of its nested keys."""
    rows = []
    for record in records.get("history", []):
        row: dict = {}
        for item in record.history.item:
            keys = list(item.nested_key) or [item.key]
            place = row
            for key in keys[:-1]:
                place = place.setdefault(key, {})
            place[keys[-1]] = json.loads(item.value_json)
        rows.append(row)
    return rows


def test_generated_tables_reach_the_jsonl_and_inmemory_loggers(recipe, tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(generate_recipe(recipe, {"jsonl": {"path": str(path)}, "inmemory": {}},
                                           log_to_console=True))
    trainer.fit()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    tables = [line["table"] for line in lines if "table" in line]
    assert [(t["name"], t["step"], t["columns"]) for t in tables] == [("generations", 1, COLUMNS),
                                                                      ("generations", 2, COLUMNS)]
    assert tables[-1]["rows"] == generations(trainer)
    assert [t["rows"][0][0] for t in tables] == ["the quick", "the quick"]
    # the table lines carry no top-level "step": readers that plot every such line as metrics are not misled
    assert [line["step"] for line in lines if "step" in line] == [1, 2]
    (memory,) = [logger for logger in trainer.loggers if isinstance(logger, InMemoryLogger)]
    assert json.loads(memory.tables["generations"]) == {"columns": COLUMNS, "data": generations(trainer)}
    assert "[generations]" not in capsys.readouterr().out  # the console gets no copy when a logger records it


def test_generated_tables_reach_wandb_mlflow_and_tensorboard(recipe, tmp_path, monkeypatch, file_store):  # noqa: F811
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    loggers = {"wandb": {"dir": str(tmp_path)},
               "mlflow": {"tracking_uri": file_store, "experiment_name": "tables", "log_system_metrics": False},
               "tensorboard": {"log_dir": str(tmp_path / "tb")}}
    trainer = make_trainer(generate_recipe(recipe, loggers, run_name="tables-run"))
    trainer.fit()
    rows = generations(trainer)

    run_file, records = offline_run(tmp_path)  # wandb: the history rows point at the table files it wrote
    logged = {row["_step"]: row["generations"] for row in history(records) if "generations" in row}
    assert sorted(logged) == [1, 2] and logged[2]["_type"] == "table-file"
    table = json.loads((run_file.parent / "files" / logged[2]["path"]).read_text())
    assert (table["columns"], table["data"]) == (COLUMNS, rows)

    client, (run,) = mlflow_runs(file_store, "tables")  # MLflow: Composer's <name>.json, later steps appended
    local = client.download_artifacts(run.info.run_id, "generations.json", str(tmp_path / "download"))
    table = json.loads(Path(local).read_text())
    assert table["columns"] == COLUMNS and table["data"][2:] == rows and len(table["data"]) == 4
    assert {"path": "generations.json", "type": "table"} in json.loads(run.data.tags["mlflow.loggedArtifacts"])

    events = EventAccumulator(str(tmp_path / "tb" / "tables-run"), size_guidance={"tensors": 0})
    events.Reload()  # tensorboard: a Markdown table per step under the table's name
    texts = events.Tensors("generations/text_summary")
    assert [t.step for t in texts] == [1, 2]
    markdown = texts[-1].tensor_proto.string_val[0].decode()
    assert markdown.splitlines()[:2] == ["| prompt | generation |", "| --- | --- |"]
    assert markdown.splitlines()[2].startswith(f"| {rows[0][0]} | ")


def test_wandb_and_jsonl_tables_take_cells_of_mixed_types(tmp_path, monkeypatch):
    from llmfoundry.train.loggers.jsonl import JsonlLogger
    from llmfoundry.train.loggers.settings import JsonlSettings, WandbSettings
    from llmfoundry.train.loggers.wandb import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    # eval_output_logging's input_tokens: a list for one task type, a list of lists for another
    rows = [["x | y\nz", [1, 2], 0.5], ["w", [[3], [4, 5]], 1.0]]
    wandb = WandbLogger(WandbSettings(dir=str(tmp_path)), "mixed")
    jsonl = JsonlLogger(JsonlSettings(path=str(tmp_path / "m.jsonl")))
    for logger in (wandb, jsonl):
        logger.log_table(["input", "tokens", "result"], rows, name="outputs", step=3)
    jsonl.log_table(["input", "tokens", "result"], [[Unprintable(), [], 0.0]], name="odd", step=3)
    wandb.close()
    jsonl.close()
    run_file, records = offline_run(tmp_path)
    (item,) = [row["outputs"] for row in history(records) if "outputs" in row]
    assert json.loads((run_file.parent / "files" / item["path"]).read_text())["data"] == rows
    written = [json.loads(line)["table"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert written[0] == {"name": "outputs", "step": 3, "columns": ["input", "tokens", "result"], "rows": rows}
    assert written[1]["rows"] == [["<unprintable>", [], 0.0]]  # what JSON has no type for is written as text


class Unprintable:
    def __repr__(self) -> str:
        return "<unprintable>"
