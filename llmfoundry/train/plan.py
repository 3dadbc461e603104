"""`llmfoundry plan`'s estimate: memory, communication, step time, MFU and time to max_duration of a recipe on a
given number of GPUs, and the changes that make it fit or go faster (each checked by the same estimate).

Memory per GPU (plan_memory.py measures the activations on fake tensors, with the recipe's tensor-parallel plan
applied on a fake process group):
  forward/backward: params + optimizer state + activations + gradients held (all of them, sharded, when
  microbatches accumulate: FSDP2 reduce-scatters after every microbatch, parallel.gradient_sync; otherwise those
  made before the peak) + FSDP2's unsharded blocks (the root, a block, its unsharded gradients and the next
  block's all-gather; SHARD_GRAD_OP keeps every block gathered)
  a block's reduce-scatter under FSDP2 (``Planner._fsdp_moments``): block 1's, with every later block's sharded
  gradients, block 0 prefetched, the block's unsharded gradients and the reduce-scatter's input (the peak when
  accumulating); block 0's, one block's sharded gradients more, nothing prefetched, its backward's activations
  or the reduce-scatter's input and output
  end of backward without FSDP2: params + optimizer state + every gradient + one block's backward (its
  activations, recomputed with checkpointing)
  optimizer step: params + gradients + optimizer state + the step's temporaries
Checked against torch's MemTracker / FSDPMemTracker around a real step (tests/train/test_plan.py): 1 rank; 2 FSDP2
ranks, also accumulating; 2 TP ranks (ffn, block); an MoE model with its experts sharded by FSDP2 and split over
2 ranks (expert parallelism). Expert parallelism is not run on fake tensors (the routing depends on the data):
each rank keeps experts / moe_world_size of each MoE layer's experts, sharded over the edp ranks, and its
all-to-all sends the routed rows of a balanced router.
Activations per activation_checkpointing_mode: none, ``full`` and ``selective_op`` measured (uniform per block, so 1
and 2 blocks extrapolate); ``selective_layer_N`` composed from the none and full runs (``_mixed``).
Time per step (roofline): model FLOPs (``flops_per_token``) plus the recompute (``full``: the forward again, x4/3;
``selective_op``: what FlopCounterMode counts it adding per block on the fake runs, about 1/12 of a block's forward
matmuls; ``selective_layer_N``: k/L of a forward for its k = L // N full blocks) at matmul_efficiency (by width) of the GPU's peak, or the HBM traffic, whichever is longer, plus the FSDP2 collectives that do
not overlap (the first block's all-gather and the last reduce-scatter are exposed; the rest overlaps compute
unless it takes longer), tensor parallelism's collectives as the fake runs counted them, expert parallelism's
all-to-all. Each collective runs at its group's bus bandwidth: NVLink within a node; a group
spanning nodes through all of each node's NICs (NCCL's one ring per NIC); HSDP's replica all-reduce through one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.precision import DTYPES, low_dtype, weight_dtype
from llmfoundry.core.timeunits import Time
from llmfoundry.train import layouts, plan_memory
from llmfoundry.train.compat import device_batch_size
from llmfoundry.train.plan_hardware import GPU, LINK_EFFICIENCY, matmul_efficiency
from llmfoundry.train.settings import parse_checkpointing_mode


@dataclass(frozen=True)
class Choice:
    """What the estimate varies: microbatch, activation checkpointing, sharding strategy."""

    micro: int
    checkpointing: str | None  # fsdp_config.activation_checkpointing_mode, None without activation_checkpointing
    strategy: str | None  # fsdp_config.sharding_strategy, None without fsdp_config


@dataclass
class Estimate:
    choice: Choice
    world: int
    shard: int
    params: float
    grads: float
    optimizer: float
    activations: float  # of this choice
    activations_other: float  # without checkpointing, or with full checkpointing for a choice without it
    grads_held: float
    fsdp_gathered: float
    optimizer_temp: float
    peak: float
    memory: float
    comm_bytes: dict
    step_s: float
    tok_per_s_gpu: float
    mfu: float
    steps: int | None
    tokens_per_step: int

    @property
    def fits(self) -> bool:
        return self.peak <= self.memory * 0.95  # the allocator's fragmentation and CUDA context

    def hours(self) -> float | None:
        return None if self.steps is None else self.steps * self.step_s / 3600


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _uniform(mode: str | None) -> str | None:
    """A mode the fake runs measure as it is (uniform per block); selective_layer_N is composed of None and full
    runs, so its parameter counts are read from the None ones."""
    return None if mode is not None and parse_checkpointing_mode(mode)[0] == "selective_layer" else mode


class Planner:
    """The recipe's model, measured once per (microbatch, checkpointing mode, parameter dtype); estimates per
    choice."""

    def __init__(self, cfg, nodes: int, gpus_per_node: int, gpu: GPU, measured: dict | None = None):
        """``measured``: another Planner's ``measured`` for the same model, max_seq_len, precision and optimizer
        (the batch sizes, world, activation_checkpointing or TP degree may differ: the fake runs are keyed by what
        they depend on), so that its fake runs are not repeated."""
        self.cfg, self.nodes, self.gpus_per_node, self.gpu = cfg, nodes, gpus_per_node, gpu
        self.world = nodes * gpus_per_node
        self.tp = cfg.tp_config.tensor_parallel_degree if cfg.tp_config is not None else 1
        self.device_batch = device_batch_size(cfg.global_train_batch_size, self.world, cfg.tp_config)
        model = plan_memory.meta_model(cfg.model)
        if self.tp > 1:  # the layout checks the trainer makes (parallel.py), the same one-line errors
            layouts.check_tensor_parallel(model, cfg.tp_config, cfg.fsdp_config, self.world)
        blocks = model.blocks()
        self.n_params = sum(p.numel() for p in model.parameters())
        self.block_params = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
        self.root_params = self.n_params - sum(sum(p.numel() for p in b.parameters()) for b in blocks)
        self.layers = len(blocks)
        # expert parallelism: the experts' share of a block, split over moe_world_size ranks (layouts.py)
        ep_plan = layouts.expert_parallel_plan(model)
        self.ep = ep_plan.degree if ep_plan is not None else 1
        self.block_experts = max((sum(p.numel() for m in ep_plan.expert_modules(b) for p in m.parameters())
                                  for b in blocks), default=0) if ep_plan is not None else 0
        self.experts = self.layers * self.block_experts  # every expert's parameters, sharded over all ranks
        if self.ep > 1:
            layouts.check_expert_parallel(self.ep, cfg.fsdp_config, self.world, self.tp > 1)
        self.flops_per_token = model.flops_per_token(cfg.max_seq_len)
        self.attention_flops_per_token = self.flops_per_token - model.flops_per_token(0)  # the part linear in seq
        self.state_per_param = plan_memory.STATE_PER_PARAM.get(cfg.optimizer.name, 2)
        if getattr(cfg.optimizer.settings, "amsgrad", False):
            self.state_per_param += 1
        # (micro, mode, dtype), with TP also (degree, strategy) -> the fake runs
        self.measured: dict = {} if measured is None else measured

    def _measure(self, micro: int, mode: str | None, dtype: torch.dtype):
        """The fake runs of 1 and 2 blocks, every block checkpointed by ``mode`` (None, full or selective_op)."""
        key = (micro, mode, dtype) if self.tp == 1 else (micro, mode, dtype, self.tp, self.cfg.tp_config.strategy)
        if key not in self.measured:
            layers = (1, 2) if self.layers >= 2 else (self.layers,)
            self.measured[key] = [plan_memory.measure(self.cfg, micro, n, mode, dtype) for n in layers]
        return self.measured[key]

    def _local_params(self, micro: int, mode: str | None, dtype: torch.dtype) -> tuple[float, float, float]:
        """(the model's, one block's, the rest's) parameters on one TP rank, before FSDP2 shards them: the fake runs'
        counts with the tensor-parallel plan applied (embeddings, head and what the plan leaves whole are
        replicated); the meta model's without TP."""
        if self.tp == 1:
            return float(self.n_params), float(self.block_params), float(self.root_params)
        runs = self._measure(micro, _uniform(mode), dtype)
        block = float(runs[1].params - runs[0].params) if len(runs) == 2 else self.block_params / self.tp
        root = runs[0].params - block
        return root + self.layers * block, block, root

    def _comm_per_microbatch(self, micro: int, mode: str | None, dtype: torch.dtype) -> float:
        """Bytes one rank moves in the tensor-parallel collectives of one microbatch's forward and backward, as the
        fake runs counted them (extrapolated in blocks). selective_layer_N: the uncheckpointed run's traffic plus
        the recompute of its k = L // N checkpointed blocks (k / L of what full checkpointing adds)."""
        if _uniform(mode) != mode:
            none, full = (self._comm_per_microbatch(micro, m, dtype) for m in (None, "full"))
            return none + self._recomputed_blocks(mode) / max(1, self.layers) * (full - none)
        runs = self._measure(micro, mode, dtype)
        return float(runs[0].comm + (self.layers - 1) * (runs[1].comm - runs[0].comm) if len(runs) == 2 else
                     runs[0].comm)

    def _extrapolated(self, micro: int, mode: str | None, dtype: torch.dtype) -> tuple[float, float, float]:
        """(activations, gradients made before their peak, optimizer temporaries) of the whole model, one rank."""
        kind, every = parse_checkpointing_mode(mode) if mode is not None else (None, 0)
        if kind == "selective_layer":
            return self._mixed(micro, every, dtype)
        runs = self._measure(micro, mode, dtype)
        if len(runs) == 1:
            return float(runs[0].activations), float(runs[0].grads_at_peak), float(runs[0].optimizer_temp)
        one, two = runs
        more = self.layers - 1
        acts, grads, opt_temp = (float(getattr(one, k) + more * (getattr(two, k) - getattr(one, k)))
                                 for k in ("activations", "grads_at_peak", "optimizer_temp"))
        # the peak of 1 and 2 blocks can be a moment every block has passed (the embedding's backward): at L blocks
        # the start of the backward, holding every block's saved tensors, can be higher
        saved = float(one.saved + more * (two.saved - one.saved))
        return (acts, grads, opt_temp) if acts >= saved else (saved, 0.0, opt_temp)

    def _mixed(self, micro: int, every: int, dtype: torch.dtype) -> tuple[float, float, float]:
        """selective_layer_N: k = L // N blocks checkpointed in full (the Nth, 2Nth, ...; activation_ckpt.py), the
        others keeping everything. Its peak is the larger of two moments, each made of the none and full runs' per
        block figures: the start of the backward (every block's saved tensors: k blocks' inputs, L - k blocks' whole
        activations) and the backward of the last checkpointed block, recomputed as in a full run, with the blocks
        before it still holding theirs (those after it have freed theirs by then)."""
        none, full = self._measure(micro, None, dtype), self._measure(micro, "full", dtype)
        k = self.layers // every
        if k == 0 or len(none) == 1:  # no block checkpointed; or a 1-block model, checkpointed when N is 1
            return self._extrapolated(micro, "full" if k else None, dtype)
        acts_none, grads_none, opt_temp = self._extrapolated(micro, None, dtype)
        _, grads_full, _ = self._extrapolated(micro, "full", dtype)
        per_none = none[1].activations - none[0].activations
        per_full = full[1].activations - full[0].activations
        start = acts_none - k * (per_none - per_full)
        # the last checkpointed block is block kN (1-based): k - 1 checkpointed and kN - k other blocks before it
        recompute = full[0].activations + (k - 1) * per_full + (k * every - k) * per_none
        return (float(start), grads_none, opt_temp) if start >= recompute else (float(recompute), grads_full, opt_temp)

    def _block_activations(self, micro: int, dtype: torch.dtype) -> float:
        """What one block's backward holds (its activations without checkpointing: recomputed ones with it)."""
        runs = self._measure(micro, None, dtype)
        return float(runs[1].activations - runs[0].activations) if len(runs) == 2 else float(runs[0].activations)

    def _fsdp_moments(self, choice: Choice, shard: int, block: float, root: float, pb: int, rb: int, wb: int,
                      state: float, grads: float, held: float, accumulating: bool, block_acts: float
                      ) -> tuple[float, float]:
        """(what FSDP2 holds unsharded in forward/backward, the peak of the backward's reduce-scatters) in bytes.

        A block's parts: with expert parallelism its experts (``experts / ep`` of them per rank) are sharded over
        the edp = world / ep ranks (layouts.ep_mesh, whatever the strategy), the rest over the shard group. A part
        whose group has one rank (NO_SHARD, TP with one data-parallel group, experts with edp = 1) runs no
        collective: it is still computed in unsharded copies, but nothing is prefetched. Each block's backward ends
        in a reduce-scatter: its unsharded gradients (param dtype) are copied into the input (reduce dtype, the
        whole block), then freed; the output is the block's share. Two moments: block 1's copy (block 0
        prefetched, every later block's sharded gradients made) and block 0's (its own activations first; nothing
        left to prefetch)."""
        fsdp = self.cfg.fsdp_config
        experts = self.block_experts / self.ep
        rest = block - self.block_experts  # before TP splits it: TP and EP do not combine (layouts.py)
        unsharded = rest + experts
        edp = self.world // self.ep
        collective = (rest if shard > 1 else 0.0) + (experts if edp > 1 else 0.0)
        sharded_block = rest / shard + experts / edp
        if choice.strategy in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2") or fsdp.reshard_after_forward is False:
            gathered, prefetch = (root + self.layers * unsharded) * pb, 0.0  # every block stays gathered
        else:
            gathered, prefetch = (root + unsharded) * pb, (collective * pb if self.layers > 1 else 0.0)
        copying = unsharded * pb + unsharded * rb  # the unsharded gradients and the reduce-scatter's input
        if accumulating:
            held_1 = held_0 = grads  # every sharded gradient, from the earlier microbatches
        else:
            held_1 = max(held, grads - 2 * sharded_block * wb)
            held_0 = max(held, grads - sharded_block * wb)
        block_1 = state + held_1 + gathered + prefetch + copying
        block_0 = state + held_0 + gathered + max(block_acts + unsharded * pb, unsharded * rb + sharded_block * rb)
        return gathered + prefetch + unsharded * pb, max(block_1, block_0)

    def recompute_share(self, micro: int, mode: str | None, dtype: torch.dtype) -> float:
        """The FLOPs a checkpointing mode adds in recompute, as a share of the training FLOPs without it."""
        if mode is None:
            return 0.0
        kind, every = parse_checkpointing_mode(mode)
        if kind == "full":
            return 1 / 3  # the forward, a third of 6N, once more
        if kind == "selective_layer":
            return self._recomputed_blocks(mode) / max(1, self.layers) / 3
        # selective_op: what the per-op policy recomputes, counted on the fake runs (FlopCounterMode): per block, the
        # difference it makes to a block's FLOPs, against the uncheckpointed model's
        none, sel = self._measure(micro, None, dtype), self._measure(micro, mode, dtype)
        if len(none) == 1:
            return (sel[0].flops - none[0].flops) / max(1, none[0].flops)
        extra = (sel[1].flops - sel[0].flops) - (none[1].flops - none[0].flops)
        total = none[0].flops + (self.layers - 1) * (none[1].flops - none[0].flops)
        return max(0.0, self.layers * extra / max(1, total))

    def shard_degree(self, strategy: str | None) -> int:
        fsdp = self.cfg.fsdp_config
        dp = self.world // self.tp
        if fsdp is None or strategy is None or self.world == 1:
            return 1
        if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
            return dp
        if strategy == "NO_SHARD":
            return 1
        shard = fsdp.data_parallel_shard_degree
        return min(dp, self.gpus_per_node if shard == -1 else shard)

    def estimate(self, choice: Choice) -> Estimate:
        cfg, fsdp = self.cfg, self.cfg.fsdp_config
        # the trainer trains min(microbatch, device batch) samples at a time (trainer.py, compat.py)
        choice = dataclasses.replace(choice, micro=max(1, min(choice.micro, self.device_batch)))
        sharded = fsdp is not None and self.world > 1 and choice.strategy is not None
        shard = self.shard_degree(choice.strategy)
        wb = _bytes(weight_dtype(cfg.precision))
        if sharded:
            mp = fsdp.mixed_precision
            low = low_dtype(cfg.precision)
            if isinstance(mp, dict):
                pdt = DTYPES[mp["param_dtype"]] if "param_dtype" in mp else weight_dtype(cfg.precision)
                rdt = DTYPES[mp["reduce_dtype"]] if "reduce_dtype" in mp else pdt
            else:
                pdt = weight_dtype(cfg.precision) if mp == "FULL" or low is None else low
                rdt = pdt if mp == "PURE" else torch.float32
        else:
            pdt = rdt = weight_dtype(cfg.precision)
        pb, rb = _bytes(pdt), _bytes(rdt)
        n_local, block, root = self._local_params(choice.micro, choice.checkpointing, pdt)
        params = ((n_local - self.experts) / shard + self.experts / self.world) * wb
        grads = params
        optimizer = self.state_per_param * params
        acts, grads_early, opt_temp = self._extrapolated(choice.micro, choice.checkpointing, pdt)
        other, _, _ = self._extrapolated(choice.micro, None if choice.checkpointing else "full", pdt)
        opt_temp = opt_temp * wb / pb / shard  # the fake runs' figures are one TP rank's already
        accumulating = self.device_batch > choice.micro
        if accumulating:
            held = grads  # every (sharded) gradient, from the first microbatch's backward on (parallel.gradient_sync)
        else:
            held = grads_early / shard * wb / pb
        block_acts = self._block_activations(choice.micro, pdt)
        if not sharded:
            gathered = 0.0
            # the end of the backward: the first block's backward, with (almost) every gradient made
            late = params + optimizer + max(grads, held) + block_acts
            peak = max(params + optimizer + acts + held, late, params + optimizer + grads + opt_temp)
        else:
            gathered, late = self._fsdp_moments(choice, shard, block, root, pb, rb, wb, params + optimizer, grads,
                                                held, accumulating, block_acts)
            peak = max(params + optimizer + acts + held + gathered, late, params + optimizer + grads + opt_temp)
        recompute = self.recompute_share(choice.micro, choice.checkpointing, pdt)
        return self._timed(choice, shard, n_local, pdt, rb, recompute, Estimate(
            choice=choice, world=self.world, shard=shard, params=params, grads=grads, optimizer=optimizer,
            activations=acts, activations_other=other, grads_held=held, fsdp_gathered=gathered,
            optimizer_temp=opt_temp, peak=peak, memory=self.gpu.memory_bytes, comm_bytes={}, step_s=0.0,
            tok_per_s_gpu=0.0, mfu=0.0, steps=None, tokens_per_step=0))

    def _timed(self, choice: Choice, shard: int, n_local: float, pdt: torch.dtype, rb: int, recompute: float,
               est: Estimate) -> Estimate:
        cfg, gpu, pb, experts = self.cfg, self.gpu, _bytes(pdt), self.experts
        micros = math.ceil(self.device_batch / choice.micro)
        tokens_gpu = self.device_batch * cfg.max_seq_len  # a TP group's ranks share their tokens
        flops = self._rank_flops_per_token(n_local) * tokens_gpu
        flops *= 1 + recompute  # what activation checkpointing recomputes (recompute_share)
        compute_s = flops / (gpu.bf16_flops * matmul_efficiency(getattr(cfg.model.settings, "d_model", 4096)))
        # HBM: weights read in forward and twice in backward per microbatch (a rank's own experts), activations
        # written and read, the optimizer reading and writing parameters, gradients and state
        hbm = micros * (3 * (n_local - experts + experts / self.ep) * pb + 2 * est.activations)
        hbm += 2 * (est.params + est.grads + est.optimizer)
        compute_s = max(compute_s, hbm / gpu.hbm_bytes_per_s)
        comm: dict[str, float] = {}
        seconds: list[float] = []  # each collective at its own group's bandwidth
        regather = choice.strategy not in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")
        passes = (2 if regather else 1) * pb + rb  # bytes per gathered element: all-gathers, then a reduce-scatter
        dense = n_local - experts  # sharded over the shard group; with expert parallelism the experts over edp
        if shard > 1:
            gathered = dense * (shard - 1) / shard
            # FSDP2 reshards after every backward, so even SHARD_GRAD_OP gathers again in each microbatch's forward
            comm["fsdp all-gather (forward)"] = micros * gathered * pb
            comm["fsdp all-gather (backward)"] = micros * gathered * pb if regather else 0.0
            comm["fsdp reduce-scatter"] = micros * gathered * rb  # after every microbatch (gradient_sync)
            seconds.append(micros * gathered * passes / self._ring_bytes_per_s(shard * self.tp))  # its dp ranks
            replicas = self.world // self.tp // shard
            if replicas > 1:  # one all-reduce per position in the shard group, each over its own GPU's link
                comm["replica all-reduce (hybrid)"] = 2 * dense / shard * rb * (replicas - 1) / replicas
                seconds.append(comm["replica all-reduce (hybrid)"] / self._ring_bytes_per_s(self.world, one_nic=True))
        elif self.world // self.tp > 1:
            dp = self.world // self.tp
            comm["gradient all-reduce"] = 2 * dense * rb * (dp - 1) / dp
            seconds.append(comm["gradient all-reduce"] / self._ring_bytes_per_s(self.world))
        edp = self.world // self.ep
        if experts and edp > 1:  # the experts' own FSDP2 group: the edp ranks holding the same experts, one in every
            # ep ranks, so it spans the whole world whatever the strategy (layouts.ep_mesh)
            gathered = experts / self.ep * (edp - 1) / edp
            comm["fsdp experts (all-gathers, reduce-scatter)"] = micros * gathered * passes
            seconds.append(comm["fsdp experts (all-gathers, reduce-scatter)"] / self._ring_bytes_per_s(self.world))
        # tensor and expert parallelism's collectives sit between a block's matmuls, which wait for them: exposed
        blocking = 0.0
        if self.tp > 1:  # what the plan's DTensors ran in the fake runs (all-reduces; with block, gathers/scatters)
            comm["tensor-parallel collectives"] = micros * self._comm_per_microbatch(choice.micro,
                                                                                      choice.checkpointing, pdt)
            blocking = comm["tensor-parallel collectives"] / self._ring_bytes_per_s(self.tp)
        if self.ep > 1:  # each MoE layer sends its routed rows out and back in forward and backward, and again in
            # the forward a checkpointed block recomputes; the rows for other ranks' experts, (ep - 1) / ep of them
            # with a balanced router (routing is data-dependent: not run on fake tensors)
            f = cfg.model.settings.ffn_config
            act = _bytes(low_dtype(cfg.precision) or pdt)
            rows = choice.micro * cfg.max_seq_len * f.moe_top_k
            exchanges = 4 + 2 * self._recomputed_blocks(choice.checkpointing) / max(1, self.layers)
            comm["expert-parallel all-to-all"] = (micros * self.layers * exchanges * rows * cfg.model.settings.d_model
                                                  * act * (self.ep - 1) / self.ep)
            # across nodes each GPU's rows leave through its own NIC
            blocking += comm["expert-parallel all-to-all"] / self._ring_bytes_per_s(
                self.ep, one_nic=self.ep > self.gpus_per_node)
        comm_s = sum(seconds)  # FSDP2's and data parallelism's, overlapping the blocks' compute
        exposed = max(0.0, comm_s - compute_s) + comm_s / max(1, 2 * self.layers) + blocking
        opt_s = 2 * (est.params + est.grads + est.optimizer) / gpu.hbm_bytes_per_s
        step_s = compute_s + exposed + opt_s
        model_flops = self.flops_per_token * tokens_gpu / self.tp
        est.comm_bytes = comm
        est.step_s = step_s
        est.tok_per_s_gpu = tokens_gpu / self.tp / step_s
        est.mfu = model_flops / step_s / gpu.bf16_flops
        est.tokens_per_step = cfg.global_train_batch_size * cfg.max_seq_len
        est.steps = self.steps()
        return est

    def _recomputed_blocks(self, mode: str | None) -> int:
        """Blocks whose forward the backward runs again (every one with full or selective_op; L // N with
        selective_layer_N)."""
        if mode is None:
            return 0
        kind, every = parse_checkpointing_mode(mode)
        return self.layers // every if kind == "selective_layer" else self.layers

    def _rank_flops_per_token(self, n_local: float) -> float:
        """Training FLOPs one rank computes per token of its TP group's batch: with tensor parallelism only what
        the plan splits is divided (the rank's share of the matmul parameters, from the fake runs' counts:
        embeddings, head and, with ``ffn``, attention's projections stay whole; attention's scores split by head
        with ``block`` only)."""
        if self.tp == 1:
            return self.flops_per_token
        weights = self.flops_per_token - self.attention_flops_per_token
        split_heads = self.cfg.tp_config.strategy == "block"
        return weights * n_local / self.n_params + self.attention_flops_per_token / (self.tp if split_heads else 1)

    def _ring_bytes_per_s(self, span: int, one_nic: bool = False) -> float:
        """Bus bandwidth of a ring collective over ``span`` consecutive ranks: NVLink within a node. Across nodes
        NCCL runs one ring per GPU's NIC, so a collective of the whole group leaves each node through all of its
        NICs (gpus_per_node x one NIC, at most NVLink: 8 x 50 GB/s on an H100 node); ``one_nic``: groups of one rank
        per node (HSDP's replicas), each all-reduce on its own GPU's NIC."""
        gpu = self.gpu
        if span <= self.gpus_per_node:
            return gpu.intra_node_bytes_per_s * LINK_EFFICIENCY
        if one_nic:
            return gpu.inter_node_bytes_per_s * LINK_EFFICIENCY
        return min(gpu.intra_node_bytes_per_s, self.gpus_per_node * gpu.inter_node_bytes_per_s) * LINK_EFFICIENCY

    def steps(self) -> int | None:
        """Batches in max_duration where the recipe alone says it (ba, tok, sp); None for epochs."""
        time = Time.parse(self.cfg.max_duration)
        if time.unit == "ba":
            return int(time.value)
        if time.unit == "tok":
            return math.ceil(time.value / (self.cfg.global_train_batch_size * self.cfg.max_seq_len))
        if time.unit == "sp":
            return math.ceil(time.value / self.cfg.global_train_batch_size)
        return None


def recipe_choice(cfg) -> Choice:
    fsdp = cfg.fsdp_config
    micro = cfg.device_train_microbatch_size
    if micro == "auto":
        raise ConfigError("device_train_microbatch_size: auto is searched on the GPUs; plan needs a number")
    mode = fsdp.activation_checkpointing_mode if fsdp is not None and fsdp.activation_checkpointing else None
    return Choice(micro=int(micro), checkpointing=mode, strategy=fsdp.sharding_strategy if fsdp is not None else None)
