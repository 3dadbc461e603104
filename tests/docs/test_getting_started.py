"""docs/getting-started.md, followed word for word: every offline command, in order, in a copy of the repository.

The commands are read from the guide's ```bash blocks, so the guide cannot drift from what works. The install
step (network) is skipped, since the tests run in an installed environment; the run stops at the next step that
the guide marks **network**. HF_HUB_OFFLINE=1 makes any attempt to reach the Hub fail at once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "getting-started.md"
CHAT_INPUT = "hello\nsystem You answer briefly.\nclear\nwhat is a list\nquit\n"


def guide_steps() -> list[tuple[str, list[str]]]:
    """(section title, commands) for each offline section, up to the first later one marked **network**."""
    steps = []
    for section in re.split(r"^## ", GUIDE.read_text(), flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        commands = []
        for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command and not command.startswith("#"):
                    commands.append(command)
        if "**network**" in title:
            if any("scripts/install.sh" in c for c in commands):
                continue  # the install step: this environment is installed already
            break
        steps.append((title, commands))
    return steps


def copy_of_repository(dest: Path) -> Path:
    """The working tree's tracked files (as they are now, edits included), without data/ or runs/."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_the_guide_names_the_offline_steps_in_order():
    titles = [title for title, _ in guide_steps()]
    assert titles and titles[0].startswith("2. Train the quickstart model")
    assert all("offline" in t for t in titles), titles
    commands = [c for _, cs in guide_steps() for c in cs]
    assert commands[0] == "llmfoundry train yamls/quickstart.yaml"
    assert commands.index("llmfoundry convert runs/quickstart runs/quickstart-hf") < commands.index(
        "llmfoundry train yamls/finetune/instruct-local.yaml") < commands.index("llmfoundry eval yamls/eval/gauntlet.yaml")


@pytest.mark.slow
@pytest.mark.timeout(2400)  # ten commands of up to 600 s each (usually a few minutes in all)
def test_following_getting_started_word_for_word_works_offline(tmp_path):
    work = copy_of_repository(tmp_path / "llmfoundry")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    outputs: dict[str, str] = {}
    for title, commands in guide_steps():
        for command in commands:
            result = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                                    input=CHAT_INPUT if " chat " in f"{command} " else "", timeout=600)  # fmt: skip
            output = result.stdout + result.stderr
            assert result.returncode == 0, f"step {title!r}: `{command}` exited {result.returncode}:\n{output[-3000:]}"
            outputs[command] = output

    # README/issue acceptance for the quickstart: the eval loss at least 40% lower, a checkpoint in the run folder.
    quickstart = outputs["llmfoundry train yamls/quickstart.yaml"]
    assert "preparing quickstart data" in quickstart
    initial, final = map(float, re.search(r"eval loss: ([\d.]+) \(batch 0\) -> ([\d.]+)", quickstart).groups())
    assert final < 0.6 * initial, f"eval loss {initial} -> {final}"
    assert (work / "runs/quickstart/latest").exists()
    assert "| python_code |" in quickstart  # the gauntlet table at the end of training

    assert "def main(" in outputs['llmfoundry generate runs/quickstart --prompt "def main(" --max_new_tokens 40']
    assert (work / "runs/quickstart-hf/config.json").is_file()
    chat = outputs["llmfoundry chat runs/chat-local"]
    assert chat.count("Assistant:") == 2 and "(conversation cleared)" in chat
    gauntlet = outputs["llmfoundry eval yamls/eval/gauntlet.yaml"]
    assert re.search(r"\| category \| base \| exported \| instruct \|", gauntlet), gauntlet[-2000:]
    assert (work / "runs/eval/gauntlet.json").is_file()
