"""llm-foundry's own recipes, shrunk to tiny local equivalents and checked against this project's schema.

``tests/fixtures/llm_foundry_recipe_keys.json`` lists every key path and value that llm-foundry's train and eval
recipes set (scripts/train/yamls/pretrain, scripts/train/yamls/finetune, scripts/eval/yamls of
mosaicml/llm-foundry, with the commit each was read from). ``tiny_equivalent`` rebuilds each recipe from that
inventory with the same keys and values, except what makes it tiny and local:

* the model: ``d_model`` 64, ``n_heads`` 4, ``n_layers`` 2, ``max_seq_len`` 64, ``vocab_size`` 512 (the test
  tokenizer's); a Hugging Face hub name (``pretrained_model_name_or_path``, a LoRA adapter) becomes a tiny local
  folder of the same architecture (GPT-Neo, GPT-2, OPT, MPT, DBRX, BLOOM, T5) that this module writes;
* ``max_seq_len`` (and the values interpolated from it, ``icl_seq_len``) 64;
* the tokenizer name: the tests' 512-token tokenizer (its ``kwargs`` are kept);
* data: text loaders read the tests' MDS shards (``train``/``val``); finetuning loaders read local JSONL
  question/answer files read through a ``preprocessing_fn`` of this module (hub datasets become ``hf_name:
  json``), or MDS finetuning shards for a streaming (``remote``) loader; ICL task files become the repository's
  tiny task files of the same task type, and task-list or gauntlet paths ``eval/yamls/tasks_tiny.yaml`` (copied
  with absolute task paths) / ``gauntlet_tiny.yaml``; ``load_path`` a tiny checkpoint;
* durations in batches: ``max_duration`` 2ba, and ``eval_interval``/``save_interval`` given in batches 2ba;
  ``global_train_batch_size`` 4, ``device_train_microbatch_size`` at most 2, ``device_eval_batch_size`` at most 4;
* ``save_folder`` (added where ``autoresume: true`` needs one, as Composer does) and
  ``callbacks.hf_checkpointer.save_folder`` under a temporary folder.

Everything else (precision, fsdp_config, callbacks, optimizer, scheduler, loader options, top-level variables, ...)
is kept as llm-foundry writes it, so a key or value this project does not accept shows up as a problem.

``python -m tests.recipes.llm_foundry_keys`` builds the local data in a temporary folder and prints, per recipe,
``valid`` or the validation problems.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "tests" / "fixtures" / "llm_foundry_recipe_keys.json"
SEQ = 64  # model max_seq_len and tokens per MDS sample (tests.helpers.TINY_RECIPE_SEQ)
TINY_MPT = {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": SEQ, "vocab_size": 512}
TINY_TASKS = REPO / "eval" / "yamls" / "tasks_tiny.yaml"
TINY_GAUNTLET = REPO / "eval" / "yamls" / "gauntlet_tiny.yaml"
TINY_TASK_FILES = REPO / "eval" / "local_data_tiny"
INSTRUCT_DATA = REPO / "yamls" / "finetune" / "data"
PREPROCESSOR = "tests.recipes.llm_foundry_keys:prompt_response"


def prompt_response(example: dict) -> dict:
    """The preprocessing function the tiny equivalents name (llm-foundry's recipes name their own)."""
    return {"prompt": example["question"], "response": example["answer"]}


# ------------------------------------------------------------------------------------------------- the inventory
def load_inventory() -> dict:
    return json.loads(INVENTORY.read_text())


def recipe_names() -> list[str]:
    return sorted(load_inventory()["recipes"])


_STEP = re.compile(r"\[(\d+)\]|([^.\[\]]+)")  # a key path's steps: names and [list indices]


def _slot(node: Any, step: str | int, empty: Any) -> Any:
    """``node[step]``, set to ``empty`` first when absent (lists grow to hold the index)."""
    if isinstance(step, int):
        node.extend([None] * (step + 1 - len(node)))
        if node[step] is None:
            node[step] = empty
        return node[step]
    return node.setdefault(step, empty)


def unflatten(keys: dict[str, Any]) -> dict:
    """The nested recipe from the inventory's ``a.b[0].c: value`` key paths (the inverse of its flattening)."""
    root: dict = {}
    for path, value in keys.items():
        steps = [int(index) if index else name for index, name in _STEP.findall(path)]
        node: Any = root
        for step, following in zip(steps, steps[1:]):
            node = _slot(node, step, [] if isinstance(following, int) else {})
        _slot(node, steps[-1], None)
        node[steps[-1]] = copy.deepcopy(value)
    return root


def kind_of(recipe: dict) -> str:
    return "eval" if "models" in recipe else "train"


# ------------------------------------------------------------------------------------------------ local stand-ins
_ARCHS = ("gpt-neo", "gpt2", "opt", "mpt", "dbrx", "bloom", "t5")


def architecture(source: str) -> str:
    """The architecture a hub model name stands for (the tiny folder of that architecture replaces it)."""
    name = source.lower().rsplit("/", 1)[-1]
    for arch in _ARCHS:
        if name.startswith(arch):
            return arch
    raise ValueError(f"no tiny stand-in for the hub model '{source}'")


@dataclass
class LocalData:
    """The tests' tokenizer and MDS shards, plus what the llm-foundry equivalents need, built lazily under ``root``."""

    root: Path
    tokenizer_dir: Path
    mds_root: Path
    _made: dict = field(default_factory=dict)

    def _once(self, key: str, build) -> Path:
        if key not in self._made:
            self._made[key] = build()
        return self._made[key]

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.tokenizer_dir))

    def hf_folder(self, arch: str) -> Path:
        return self._once(f"hf-{arch}", lambda: _write_tiny_hf(arch, self.tokenizer(), self.root / f"hf-{arch}"))

    def lora_folder(self) -> Path:
        return self._once("lora", lambda: _write_tiny_lora(self.hf_folder("opt"), self.root / "lora-opt"))

    def json_dir(self) -> Path:
        """train/validation/test JSONL files of question/answer records (prompt_response maps them)."""

        def build() -> Path:
            out = self.root / "finetuning-json"
            out.mkdir(parents=True, exist_ok=True)
            splits = (("train", "instruct_train"), ("validation", "instruct_val"), ("test", "instruct_val"))
            for split, source in splits:
                lines = (INSTRUCT_DATA / f"{source}.jsonl").read_text().splitlines()
                rows = [json.loads(line) for line in lines if line]
                (out / f"{split}.jsonl").write_text(
                    "".join(json.dumps({"question": r["prompt"], "answer": r["response"]}) + "\n" for r in rows))
            return out

        return self._once("json", build)

    def finetuning_mds(self) -> Path:
        def build() -> Path:
            from llmfoundry.data.prep.finetuning import main

            out = self.root / "finetuning-mds"
            argv = ["--dataset", "json", "--data_files", str(INSTRUCT_DATA / "instruct_train.jsonl"), "--splits",
                    "train", "--out_root", str(out), "--tokenizer", str(self.tokenizer_dir), "--max_seq_len",
                    str(SEQ), "--compression", "none", "--num_workers", "1"]  # fmt: skip
            assert main(argv) == 0, "the finetuning converter failed"
            return out

        return self._once("ft-mds", build)

    def checkpoint(self) -> Path:
        """A save_folder holding a checkpoint of the tiny MPT (expansion_ratio 4, llm-foundry's defaults)."""

        def build() -> Path:
            from llmfoundry.core import dist
            from tests.helpers import make_trainer

            folder = self.root / "tiny-checkpoint"
            recipe = {
                "max_seq_len": SEQ,
                "model": {"name": "mpt_causal_lm", **TINY_MPT, "expansion_ratio": 4},
                "tokenizer": {"name": str(self.tokenizer_dir)},
                "train_loader": {"name": "text", "dataset": {"local": str(self.mds_root), "split": "train",
                                                             "max_seq_len": SEQ}},
                "optimizer": {"name": "decoupled_adamw", "lr": 1e-3},
                "max_duration": "1ba", "global_train_batch_size": 2, "progress_bar": False,
                "log_to_console": False, "save_folder": str(folder), "save_interval": "1ba",
            }  # fmt: skip
            try:
                make_trainer(recipe).fit()
            finally:
                dist.destroy()
            return folder

        return self._once("ckpt", build)


def _write_tiny_hf(arch: str, tokenizer, out: Path) -> Path:
    import torch
    import transformers as tf

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    vocab = len(tokenizer)
    if arch == "gpt-neo":
        config = tf.GPTNeoConfig(vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=4,
                                 attention_types=[[["global", "local"], 1]], window_size=32,
                                 max_position_embeddings=SEQ, intermediate_size=128, **ids)  # fmt: skip
        cls = tf.GPTNeoForCausalLM
    elif arch == "gpt2":
        config = tf.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ, **ids)
        cls = tf.GPT2LMHeadModel
    elif arch == "opt":
        config = tf.OPTConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              ffn_dim=128, max_position_embeddings=SEQ, word_embed_proj_dim=64, **ids)  # fmt: skip
        cls = tf.OPTForCausalLM
    elif arch == "mpt":
        config = tf.MptConfig(vocab_size=vocab, d_model=64, n_heads=4, n_layers=2, max_seq_len=SEQ, **ids)
        cls = tf.MptForCausalLM
    elif arch == "dbrx":
        config = tf.DbrxConfig(vocab_size=vocab, d_model=64, n_heads=4, n_layers=2, max_seq_len=SEQ,
                               attn_config={"kv_n_heads": 2, "rope_theta": 10000.0},
                               ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 2, "moe_top_k": 1},
                               **ids)  # fmt: skip
        cls = tf.DbrxForCausalLM
    elif arch == "bloom":
        config, cls = tf.BloomConfig(vocab_size=vocab, hidden_size=64, n_layer=2, n_head=4, **ids), tf.BloomForCausalLM
    elif arch == "t5":
        config = tf.T5Config(vocab_size=vocab, d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4,
                             decoder_start_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)  # fmt: skip
        cls = tf.T5ForConditionalGeneration
    else:
        raise ValueError(arch)
    torch.manual_seed(0)
    cls(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _write_tiny_lora(base: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    model.save_pretrained(out)
    return out


# --------------------------------------------------------------------------------------------- tiny equivalents
def _task_file(task_type: str | None, has_categories: bool, cot: bool) -> str:
    if task_type == "language_modeling":
        name = "tiny_sequences_lm_cat.jsonl" if has_categories else "tiny_counting_lm.jsonl"
    elif task_type in ("question_answering", "generation_task_with_answers"):
        name = "tiny_addition_cot.jsonl" if cot else "tiny_multiplication_qa.jsonl"
    elif task_type == "schema":
        name = "tiny_schema.jsonl"
    else:
        name = "tiny_arithmetic_mc.jsonl"
    return str(TINY_TASK_FILES / name)


def _tiny_tasks(tasks: Any, out_dir: Path) -> Any:
    if isinstance(tasks, str):  # the repository's tiny task list, its task files made absolute
        listed = yaml.safe_load(TINY_TASKS.read_text())
        for task in listed["icl_tasks"]:
            task["dataset_uri"] = str(REPO / task["dataset_uri"])
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / TINY_TASKS.name
        path.write_text(yaml.safe_dump(listed, sort_keys=False))
        return str(path)
    for task in tasks or []:
        task["dataset_uri"] = _task_file(task.get("icl_task_type"), bool(task.get("has_categories")),
                                         bool(task.get("cot_delimiter")))  # fmt: skip
        if isinstance(task.get("max_seq_len"), int):
            task["max_seq_len"] = SEQ
    return tasks


def _resolved(recipe: dict) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(recipe), resolve=True)


def _tiny_model(model: dict, resolved: dict, data: LocalData, recipe: dict | None = None) -> None:
    name = resolved.get("name", "hf_causal_lm")
    if name == "mpt_causal_lm":
        model.update(TINY_MPT)
    elif "pretrained_model_name_or_path" in model:
        source = resolved["pretrained_model_name_or_path"]
        folder = str(data.hf_folder(architecture(source)))
        match = re.fullmatch(r"\$\{(\w+)\}", str(model["pretrained_model_name_or_path"]))
        if match and recipe is not None:  # the recipe reads a top-level variable (model_name): point it at the folder
            recipe[match.group(1)] = folder
        else:
            model["pretrained_model_name_or_path"] = folder
    if "pretrained_lora_id_or_path" in model:
        model["pretrained_lora_id_or_path"] = str(data.lora_folder())


def _tiny_tokenizer(tokenizer: dict | None, data: LocalData, recipe: dict) -> None:
    if not isinstance(tokenizer, dict):
        return
    match = re.fullmatch(r"\$\{(variables\.)?(\w+)\}", str(tokenizer.get("name")))
    if match:  # the recipe reads a variable (llm-foundry's tokenizer_name): point the variable at the tokenizer
        scope = recipe.setdefault("variables", {}) if match.group(1) else recipe
        if not Path(str(scope.get(match.group(2), ""))).is_dir():  # the tiny model folder holds a tokenizer too
            scope[match.group(2)] = str(data.tokenizer_dir)
    else:
        tokenizer["name"] = str(data.tokenizer_dir)


def _tiny_loader(loader: dict, data: LocalData) -> None:
    if loader.get("num_workers"):
        # Worker processes for 2 batches of tiny data only cost start-up time, and dozens of short-lived worker
        # pools in one pytest process leave queues whose finalisers misbehave; the loader tests cover workers.
        loader["num_workers"] = 0
        if "prefetch_factor" in loader:
            loader["prefetch_factor"] = None
        loader["persistent_workers"] = False
    dataset = loader.get("dataset") or {}
    if loader.get("name") == "text":
        dataset["local"] = str(data.mds_root)
        if "remote" in dataset:
            dataset["remote"] = None
        dataset["split"] = {"train_small": "train", "val_small": "val"}.get(dataset.get("split"), dataset.get("split"))
    elif "remote" in dataset:  # streaming finetuning shards
        dataset["remote"] = str(data.finetuning_mds())
        dataset["local"] = str(data.root / "finetuning-cache")
    elif "hf_name" in dataset:
        dataset["hf_name"] = "json"
        dataset["hf_kwargs"] = {**(dataset.get("hf_kwargs") or {}), "data_dir": str(data.json_dir())}
        dataset.pop("data_files", None)
        dataset["preprocessing_fn"] = PREPROCESSOR
    if isinstance(dataset.get("max_seq_len"), int):
        dataset["max_seq_len"] = SEQ


def _in_batches(value: Any) -> bool:
    return isinstance(value, str) and value.endswith("ba")


def tiny_equivalent(name: str, data: LocalData, out_dir: Path) -> dict:
    """The tiny local equivalent of inventoried recipe ``name`` (unresolved: interpolations kept)."""
    recipe = unflatten(load_inventory()["recipes"][name])
    resolved = _resolved(recipe)
    variables = recipe.get("variables") or {}
    for scope in (recipe, variables):
        for key in ("max_seq_len", "icl_seq_len", "icl_max_seq_len"):
            if isinstance(scope.get(key), int):
                scope[key] = SEQ
    if kind_of(recipe) == "eval":
        for i, spec in enumerate(recipe["models"]):
            _tiny_model(spec.setdefault("model", {}), resolved["models"][i].get("model") or {}, data, recipe)
            _tiny_tokenizer(spec.get("tokenizer"), data, recipe)
            if "load_path" in spec:
                spec["load_path"] = str(data.checkpoint())
    else:
        _tiny_model(recipe["model"], resolved["model"], data, recipe)
        _tiny_tokenizer(recipe.get("tokenizer"), data, recipe)
        for key in ("train_loader", "eval_loader", "dataset"):
            if key == "dataset" and isinstance(recipe.get(key), dict):  # a recipe's own YAML anchor
                _tiny_loader({"dataset": recipe[key]}, data)
            elif isinstance(recipe.get(key), dict):
                _tiny_loader(recipe[key], data)
        recipe["max_duration"] = "2ba"
        for key in ("eval_interval", "save_interval"):
            if _in_batches(recipe.get(key)):
                recipe[key] = "2ba"
        recipe["global_train_batch_size"] = 4
        if isinstance(recipe.get("device_train_microbatch_size"), int):
            recipe["device_train_microbatch_size"] = min(recipe["device_train_microbatch_size"], 2)
        if recipe.get("save_folder"):
            recipe["save_folder"] = str(out_dir / "{run_name}" / "checkpoints")
        elif recipe.get("autoresume"):  # autoresume needs a save_folder (and run_name) in llm-foundry too
            recipe["save_folder"] = str(out_dir / "checkpoints")
        if "load_path" in recipe:
            recipe["load_path"] = str(data.checkpoint())
        hf_ckpt = (recipe.get("callbacks") or {}).get("hf_checkpointer")
        if isinstance(hf_ckpt, dict) and "save_folder" in hf_ckpt:
            hf_ckpt["save_folder"] = str(out_dir / "{run_name}" / "hf")
    if isinstance(recipe.get("device_eval_batch_size"), int):
        recipe["device_eval_batch_size"] = min(recipe["device_eval_batch_size"], 4)
    if "icl_tasks" in recipe:
        recipe["icl_tasks"] = _tiny_tasks(recipe["icl_tasks"], out_dir)
    if isinstance(recipe.get("eval_gauntlet"), str):
        recipe["eval_gauntlet"] = str(TINY_GAUNTLET)
    return recipe


def write_equivalent(name: str, data: LocalData, out_dir: Path) -> Path:
    """The tiny equivalent of ``name`` written as a YAML recipe in ``out_dir`` (what ``llmfoundry train/eval``
    reads)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (Path(name).stem + ".yaml")
    path.write_text(yaml.safe_dump(tiny_equivalent(name, data, out_dir), sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------------------ validation
def validation_problems(path: Path, kind: str) -> list[str]:
    """[] when the recipe at ``path`` validates as ``llmfoundry train``/``eval`` validates it, else its problems."""
    from llmfoundry.config.load import load_config
    from llmfoundry.core.errors import ConfigError
    from llmfoundry.eval.config import EvalConfig, load_eval_config
    from llmfoundry.registry import import_code_paths
    from llmfoundry.train.recipe import TrainConfig, validate

    try:
        if kind == "eval":
            load_eval_config(load_config(path, [], EvalConfig))
        else:
            plain = load_config(path, [], TrainConfig)
            import_code_paths(plain.get("code_paths"))
            validate(plain, TrainConfig)
    except ConfigError as error:
        return list(error.problems)
    except Exception as error:  # noqa: BLE001  (a crash in validation is a problem too, reported as such)
        from llmfoundry.core.errors import first_line

        return [f"validation raised {type(error).__name__}: {first_line(error)}"]
    return []


def check_all(data: LocalData, out_dir: Path, names: list[str] | None = None) -> dict[str, list[str]]:
    """{recipe: problems} for every inventoried recipe (or ``names``)."""
    inventory = load_inventory()["recipes"]
    results = {}
    for name in names or sorted(inventory):
        kind = kind_of(unflatten(inventory[name]))
        try:
            path = write_equivalent(name, data, out_dir / kind)
        except Exception as error:  # noqa: BLE001  (e.g. no stand-in for a model)
            results[name] = [f"no tiny equivalent: {type(error).__name__}: {error}"]
            continue
        results[name] = validation_problems(path, kind)
    return results


def build_local_data(root: Path) -> LocalData:
    """The tests' tokenizer and MDS shards (as tests/conftest.py makes them), under ``root``."""
    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer
    from tests.helpers import TINY_RECIPE_SEQ, convert_text_folder, make_corpus, write_text_folder

    corpus = make_corpus()
    tokenizer_dir = root / "tokenizer"
    train_bpe_tokenizer(corpus, vocab_size=512, out_dir=tokenizer_dir)
    mds_root = root / "mds"
    for split, docs in {"train": corpus[:160], "val": corpus[160:]}.items():
        source = write_text_folder(mds_root / "text" / split, docs)
        convert_text_folder(source, mds_root / split, tokenizer_dir, TINY_RECIPE_SEQ)
    return LocalData(root / "made", tokenizer_dir, mds_root)


def table(results: dict[str, list[str]]) -> str:
    lines = []
    for name, problems in results.items():
        lines.append(f"{name}: {'valid' if not problems else f'{len(problems)} problem(s)'}")
        lines += [f"    - {p}" for p in problems]
    valid = sum(not p for p in results.values())
    lines.append(f"\n{valid}/{len(results)} recipes validate")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    names = list(argv if argv is not None else sys.argv[1:]) or None
    with tempfile.TemporaryDirectory(prefix="lf-keys-") as tmp:
        root = Path(tmp)
        os.environ.setdefault("LLMFOUNDRY_STAGING_DIR", str(root / "staging"))
        data = build_local_data(root)
        print(table(check_all(data, root / "recipes", names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
