"""Node loss on a multi-node Ray cluster on this host (ray.cluster_utils.Cluster: a head with no CPUs for training,
two-CPU worker nodes: one that takes both ranks and a spare). Both ranks share a node because nodes simulated on one
host share /dev/shm, where streaming keeps its per-node state: two node leaders there collide (the Slurm tests give
each "node" its own /dev/shm with unshare; Ray's nodes cannot have one). A node that disappears mid-run takes its rank with it;
Ray restarts the group on the nodes left and training resumes from the newest checkpoint, ending bitwise equal to
the torchrun reference. A node drained for preemption first gets a just-in-time checkpoint. One Ray run shows both
(each Ray run costs about a minute of this machine's time: the workers import the whole stack)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from llmfoundry.launch import ray as ray_launch
from tests.launch.launch_helpers import assert_same_training, hold, release_hold, wait_until_held, write_recipe
from tests.launch.ray_helpers import cluster_environment, ray_recipe

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(moto_s3):
    from ray.cluster_utils import Cluster

    saved = dict(os.environ)
    os.environ.update(cluster_environment(moto_s3.url))
    os.environ["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] = "0.5"  # Ray passes it on to its preemption watcher
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        nodes.add_node(num_cpus=2)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address)
    yield nodes
    ray.shutdown()
    nodes.shutdown()
    os.environ.clear()
    os.environ.update(saved)


def _recipe(mds_root, tokenizer_dir, folder):
    recipe = ray_recipe(mds_root, tokenizer_dir, folder)
    recipe["callbacks"]["where"] = {"folder": str(folder)}
    return recipe


def _start(recipe_path, tmp_path, name, max_failures):
    """ray_launch.fit in a thread (the driver waits there); returns (thread, outcome dict)."""
    outcome: dict = {}

    def drive():
        try:
            outcome["result"] = ray_launch.fit(str(recipe_path), num_workers=2, max_failures=max_failures,
                                               storage_path=str(tmp_path / "ray"), run_name=name)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            outcome["error"] = error

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread, outcome


def _ended(thread, outcome):
    """For wait_until_held: why the Ray run (driven in ``thread``) ended, or None while it runs."""
    return lambda: None if thread.is_alive() else str(outcome.get("error") or outcome.get("result"))[-3000:]


def _training_node(cluster, folder, rank: int):
    """The cluster node (ray._private.node.Node) that runs ``rank`` now (the `where` callback wrote its id)."""
    node_id = (folder / f"node-rank{rank}.txt").read_text().strip()
    return next(n for n in cluster.worker_nodes if n.node_id == node_id)


def _finish(thread, outcome):
    thread.join(timeout=600)
    assert not thread.is_alive(), "the Ray run did not finish"
    assert "error" not in outcome, repr(outcome.get("error"))
    assert outcome["result"].error is None


def test_preemption_notice_saves_just_in_time_and_a_node_lost_without_one_restarts_from_the_newest_checkpoint(
        cluster, torchrun_reference, tmp_path, mds_root, tokenizer_dir):
    """`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION` (what a cloud's spot reclaim does): the workers save a
    checkpoint at once, between save_interval's (4, 8), then the node goes and training continues from it. Then the
    node the group restarted on disappears without notice: Ray restarts the group on the node left, training goes
    on from the newest complete checkpoint, and the run ends bitwise like torchrun's."""
    cluster.add_node(num_cpus=2)  # two nodes go in this run: two spares
    cluster.wait_for_nodes()
    recipe = hold(_recipe(mds_root, tokenizer_dir, tmp_path), tmp_path, batch=5, ray_preemption=True)
    hold(recipe, tmp_path, batch=6, release=False, name="second_hold")
    hold(recipe, tmp_path, batch=7, release=False, name="third_hold")
    thread, outcome = _start(write_recipe(recipe, tmp_path), tmp_path, "node-preempted", max_failures=2)
    # the ranks wait at the end of batch 5 until the notice has reached them: the checkpoint is then ep0-ba5 (a
    # notice arriving at batch 8 instead, a save_interval batch, would need no checkpoint of its own); then they
    # wait at the end of batch 6 for the node to go, so training goes on from ep0-ba5 after a restart
    wait_until_held(tmp_path, 5, _ended(thread, outcome))
    doomed = _training_node(cluster, tmp_path, rank=1)
    drain = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address", cluster.address,
                            "--node-id", doomed.node_id, "--reason", "DRAIN_NODE_REASON_PREEMPTION",
                            "--reason-message", "spot reclaim (test)", "--deadline-remaining-seconds", "60"],
                           capture_output=True, text=True, timeout=60)
    assert drain.returncode == 0, drain.stderr
    release_hold(tmp_path, 5)
    wait_until_held(tmp_path, 6, _ended(thread, outcome))
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ep0-ba*")) == ["ep0-ba4", "ep0-ba5"]  # just in time
    cluster.remove_node(doomed, allow_graceful=False)
    # the restarted group (batches 6 and 7 from ep0-ba5) is parked at the end of batch 7 when its node goes
    wait_until_held(tmp_path, 7, _ended(thread, outcome))
    lost = _training_node(cluster, tmp_path, rank=1)
    assert lost.node_id != doomed.node_id
    cluster.remove_node(lost, allow_graceful=False)
    _finish(thread, outcome)
    assert_same_training(torchrun_reference, tmp_path, exactly_once=False)
    seen = [b for b, _ in _rank0_batches(tmp_path)]
    # batches 1-5 trained once (nothing before the just-in-time checkpoint redone); 6 after each of the two
    # restarts, 7 again after the second (both from ep0-ba5, the newest complete checkpoint)
    assert all(seen.count(b) == 1 for b in range(1, 6)) and seen.count(6) == 3 and seen.count(7) == 2, seen


def _rank0_batches(folder):
    """(batch, sample hashes) of rank 0 in the order trained (record_samples' file)."""
    import json

    path = folder / "samples-2x-rank0.jsonl"
    return [(row["batch"], row["rows"]) for row in map(json.loads, path.read_text().splitlines()) if row]
