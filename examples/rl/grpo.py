"""GRPO reinforcement learning on a TPU slice, with vLLM rollout engines and rewards on spec.groups.

Runs as the entrypoint of a TPUTorchJob with groups (tpu-tpu.yaml: rollouts on a second TPU
slice; tpu-gpu.yaml: rollouts on GPUs). One Ray cluster holds them all:

- the policy (a causal LM, ``--model``: a Hugging Face model directory) trains with Ray Train's
  TorchTrainer on the job's own slice (``scaling_config()`` keeps its workers there, never on a
  rollout slice of the same shape);
- rollout engines, one per host of the rollout group (Ray actors placed by the group's Ray label,
  holding that host's chips or GPUs), are vLLM's ``LLM`` (vLLM-TorchTPU on a TPU group, CUDA vLLM on
  a GPU group, vLLM's CPU build on a CPU machine). After every step rank 0 puts the new weights into
  Ray's object store once; every engine loads them in place with vLLM's weight reload (each worker's
  ``reload_weights``, through ``LLM.collective_rpc``; no restart), drops its
  prefix cache and sets its weight version (vLLM's own), which it reports back with each rollout;
- a reward actor on the CPU group scores the answers;
- GRPO: each prompt gets ``--group-size`` answers, the advantage is the reward minus the mean of
  its group (over the group's std), the loss is ``-advantage * log p(answer | prompt)``,
  data-parallel (DDP).

The task is a verifiable toy one: the reward is the share of the answer's tokens that lie in the
lower half of the vocabulary (0.5 for a random model), so the reward rises within a few steps.

Each step's progress goes to the operator through ``tputorch.train.report()``: the step, the mean
reward (``reward_mean``, the TPUTorchJob's REWARD column), the oldest weight version an engine ran
the step's rollouts with (``weight_version``, its WEIGHTS column: below the step, an engine was
stale), each engine's (``engine_<i>_weight_version``) and the rollout throughput
(``rollout_tokens_per_s``: generated tokens per second over all engines).

``--engine torch`` replaces vLLM and the model by a small torch policy (a bigram model over 8
tokens, the same task), for a machine without vLLM. ``--cpu`` runs the trainer on CPUs (gloo,
device cpu) while keeping the TPU placement: Ray Train still reserves the training slice's chips
(TPU_VISIBLE_CHIPS per worker), rollout engines still take their host's chips or GPUs (see
``trainer()``). ``--out DIR`` makes every Train worker and rollout engine record where it ran and
what it saw (for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

TOY_VOCAB, TOY_HIDDEN = 8, 32  # --engine torch's policy
PROMPT_TOKENS = 4  # every prompt has this many tokens, every answer --answer-tokens: one tensor per batch


def reward(answer: Sequence[int], vocab: int) -> float:
    """The task's verifier: the share of the answer's tokens in the lower half of the vocabulary."""
    return sum(1 for t in answer if t < vocab // 2) / len(answer)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=("vllm", "torch"), default="vllm",
                   help="rollout engines: vLLM with --model, or a small torch policy (no vLLM needed)")
    p.add_argument("--model", default=os.environ.get("TPUTORCH_RL_MODEL"),
                   help="Hugging Face model directory every Train worker and engine loads (--engine vllm)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="answers sampled per prompt (GRPO group)")
    p.add_argument("--answer-tokens", type=int, default=4, help="tokens per answer")
    p.add_argument("--lr", type=float, default=None,
                   help="Adam's learning rate (default: 0.1 for the torch policy, 1e-6 for a real model; "
                        "a tiny random model learns the task in a few steps at 0.03)")
    p.add_argument("--rollout-group", default="rollout", help="spec.groups entry the rollout engines run on")
    p.add_argument("--reward-group", default="reward", help="spec.groups entry the reward actor runs on")
    p.add_argument("--storage-path", default=os.environ.get("STORAGE_PATH", "/tmp/tputorch-rl"))
    p.add_argument("--name", default="grpo-example")
    p.add_argument("--cpu", action="store_true", help="CPU tensors and gloo, on the same TPU placement")
    p.add_argument("--out", default=None, help="directory for per-worker / per-engine records")
    args = p.parse_args(argv)
    if args.engine == "vllm" and not args.model:
        p.error("--engine vllm needs --model (a Hugging Face model directory; or set TPUTORCH_RL_MODEL)")
    if args.lr is None:
        args.lr = 0.1 if args.engine == "torch" else 1e-6
    return args


# ---- The policy as the trainer holds it ------------------------------------------------------

def make_toy_policy():
    """A bigram model: logits for the next token from the current one, (batch, length) -> (batch, length, V)."""
    import torch

    return torch.nn.Sequential(torch.nn.Embedding(TOY_VOCAB, TOY_HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(TOY_HIDDEN, TOY_VOCAB))


def load_policy(engine: str, model: str | None):
    """(the trainer's model, its vocabulary size)."""
    if engine == "torch":
        import torch

        torch.manual_seed(0)
        return make_toy_policy(), TOY_VOCAB
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model, torch_dtype="float32")
    return policy, policy.config.vocab_size


def answer_logprobs(policy, prompts: list[list[int]], answers: list[list[int]], device):
    """log p(answer | prompt) of each (prompt, answer) pair under `policy`, summed over the answer's tokens."""
    import torch

    ids = torch.tensor([p + a for p, a in zip(prompts, answers)], device=device)
    out = policy(ids)
    logits = getattr(out, "logits", out)[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(2, ids[:, 1:, None]).squeeze(2)
    return logp[:, len(prompts[0]) - 1:].sum(1)


def cpu_state(policy) -> dict:
    """The weights as the engines load them: a CPU copy (never the live parameters, which the next
    optimizer step changes) under the model's own (Hugging Face) names."""
    return {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}


# ---- Rollout engines ---------------------------------------------------------------------------

def _record(out: str | None, name: str, record) -> None:
    """Write `record()` (called only then) as out/name.json, with --out."""
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(record(), sort_keys=True))


def _where() -> dict:
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
            "TPU_VISIBLE_CHIPS": os.environ.get("TPU_VISIBLE_CHIPS"),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "accelerators": {k: list(v) for k, v in ray.get_runtime_context().get_accelerator_ids().items()}}


class VllmEngine:
    """A rollout engine: vLLM's LLM on this host, its weights replaced in place by sync()."""

    def __init__(self, index: int, model: str, out: str | None = None, **engine_args):
        # The engine core in this process (no engine subprocess): collective_rpc hands the workers
        # the tensors as they are.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        self.index, self.out = index, out
        self.llm = LLM(model=model, seed=index, **{"enforce_eager": True, "max_model_len": 256, **engine_args})
        self.llm.update_weight_version("-1")  # the weights it started with
        self.seen: list[int] = []

    def sync(self, state: dict, version: int) -> int:
        # `state` arrives from the object store (rank 0's ray.put), resolved by Ray for this call.
        # vLLM's in-place reload on each worker: the model's own loader (it maps the Hugging Face names
        # onto its fused layers), then the processing after loading again (e.g. the CPU build's
        # repacking; a bare model.load_weights() cannot write into repacked layers).
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items())})
        self.llm.reset_prefix_cache()  # its KV blocks were computed with the old weights
        self.llm.update_weight_version(str(version))  # vLLM's own record of the version it runs
        self.seen.append(self.version())
        return self.seen[-1]

    def version(self) -> int:
        """The weight version the engine reports (-1: the weights it started with)."""
        return int(self.llm.get_weight_version())

    def _generate(self, prompts: list[list[int]], params) -> list[list[list[int]]]:
        from vllm.inputs import TokensPrompt

        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [[list(c.token_ids) for c in o.outputs] for o in outs]

    def generate(self, prompts: list[list[int]], group_size: int, answer_tokens: int) -> dict:
        from vllm import SamplingParams

        t0 = time.monotonic()
        answers = self._generate(prompts, SamplingParams(n=group_size, temperature=1.0, max_tokens=answer_tokens,
                                                         ignore_eos=True))
        seconds = time.monotonic() - t0
        _record(self.out, f"rollout-{self.index}", lambda: {**_where(), "index": self.index, "versions_seen": self.seen})
        return {"answers": answers, "version": self.version(), "tokens": sum(len(a) for g in answers for a in g),
                "seconds": seconds}

    def greedy(self, prompts: list[list[int]], tokens: int) -> list[list[int]]:
        from vllm import SamplingParams

        return [g[0] for g in self._generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens,
                                                                     ignore_eos=True))]


class TorchEngine:
    """--engine torch: the toy policy at the latest weights it was sent, sampling answers (no vLLM)."""

    def __init__(self, index: int, out: str | None = None, device: str = "cpu"):
        import torch

        self.gen = torch.Generator().manual_seed(1000 + index)
        self.index, self.device, self.out = index, device, out
        self.policy = make_toy_policy().to(device)
        self.weight_version = -1
        self.seen: list[int] = []

    def sync(self, state: dict, version: int) -> int:
        self.policy.load_state_dict(state)
        self.weight_version = version
        self.seen.append(version)
        return version

    def version(self) -> int:
        return self.weight_version

    def generate(self, prompts: list[list[int]], group_size: int, answer_tokens: int) -> dict:
        import torch

        t0 = time.monotonic()
        with torch.no_grad():
            last = torch.tensor([p[-1] for p in prompts for _ in range(group_size)], device=self.device)
            tokens = []
            for _ in range(answer_tokens):
                probs = torch.softmax(self.policy(last), -1).cpu()
                last = torch.multinomial(probs, 1, generator=self.gen).squeeze(1)
                tokens.append(last)
                last = last.to(self.device)
            flat = torch.stack(tokens, 1).tolist()
        answers = [flat[i * group_size:(i + 1) * group_size] for i in range(len(prompts))]
        _record(self.out, f"rollout-{self.index}", lambda: {**_where(), "index": self.index, "versions_seen": self.seen})
        return {"answers": answers, "version": self.weight_version, "tokens": len(flat) * answer_tokens,
                "seconds": time.monotonic() - t0}


class Reward:
    """The reward model / verifier."""

    def __init__(self, out: str | None, vocab: int):
        self.out, self.vocab = out, vocab

    def score(self, answers: list[list[list[int]]]) -> list[list[float]]:
        _record(self.out, "reward", _where)
        return [[reward(a, self.vocab) for a in group] for group in answers]


# ---- The trainer -------------------------------------------------------------------------------

def _init_gloo(rank: int, world: int) -> None:
    """--cpu: a gloo process group among the Train workers, rendezvous at rank 0's address."""
    import socket

    import ray.train.collective
    import torch.distributed as dist

    address = None
    if rank == 0:
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:  # a free port on this node (released just before gloo binds it)
            s.bind((ip, 0))
            address = f"tcp://{ip}:{s.getsockname()[1]}"
    address = ray.train.collective.broadcast_from_rank_zero(address)
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)


def rollout_step(engines: list, scorer, state: dict, version: int, prompts: list[list[int]], config: dict) -> dict:
    """Rank 0's part of a step: the weights to every engine (one put, one copy per node), the
    prompts split among the engines, the answers scored."""
    import ray

    ref = ray.put(state)
    synced = ray.get([e.sync.remote(ref, version) for e in engines])
    if synced != [version] * len(engines):
        raise RuntimeError(f"step {version}: the engines hold weight versions {synced}, not {version}")
    chunks = [prompts[i::len(engines)] for i in range(len(engines))]
    calls = [(i, c) for i, c in enumerate(chunks) if c]
    outs = ray.get([engines[i].generate.remote(c, config["group_size"], config["answer_tokens"]) for i, c in calls])
    answers = [a for o in outs for a in o["answers"]]
    return {"prompts": [p for _, c in calls for p in c], "answers": answers,
            "rewards": ray.get(scorer.score.remote(answers)),
            "versions": {i: o["version"] for (i, _), o in zip(calls, outs)},
            "tokens_per_s": sum(o["tokens"] for o in outs) / max(max(o["seconds"] for o in outs), 1e-9)}


def train_func(config: dict) -> None:
    import random

    import ray.train
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tputorch import train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if not dist.is_initialized():  # --cpu: the process group is ours (see trainer() below)
        _init_gloo(rank, world)
    device = torch.device(config["device"])  # "tpu" (torch_tpu) on the slice, "cpu" with --cpu
    policy, vocab = load_policy(config["engine"], config["model"])  # the same weights on every rank
    model = DistributedDataParallel(policy.to(device))  # no device_ids: one device per process
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    engines, scorer = config["engines"], config["reward"]
    rng = random.Random(42)
    _record(config["out"], f"train-rank-{rank}", lambda: {**_where(), "rank": rank, "world": world})
    history: dict[str, list] = {"reward": [], "weight_version": [], "engine_versions": []}

    for step in range(config["steps"]):
        batch = [None]
        if rank == 0:
            prompts = [[rng.randrange(vocab) for _ in range(PROMPT_TOKENS)] for _ in range(config["prompts"])]
            batch = [rollout_step(engines, scorer, cpu_state(model.module), step, prompts, config)]
        dist.broadcast_object_list(batch, src=0)
        b = batch[0]
        r = torch.tensor(b["rewards"])
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
        pairs = [(p, a) for p, group in zip(b["prompts"], b["answers"]) for a in group]
        mine = list(range(rank, len(pairs), world))  # this rank's share of the samples
        logp = answer_logprobs(model, [pairs[i][0] for i in mine], [pairs[i][1] for i in mine], device)
        loss = -(adv[mine].to(device) * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        versions = [b["versions"][i] for i in sorted(b["versions"])]
        history["reward"].append(float(r.mean()))
        history["weight_version"].append(min(versions))
        history["engine_versions"].append(versions)
        # The stalest engine's version before each engine's own: report() keeps the first 16 metrics.
        train.report({"step": step, train.REWARD_METRIC: history["reward"][-1], train.LOSS_METRIC: float(loss.detach().cpu()),
                      train.WEIGHT_VERSION_METRIC: min(versions), "rollout_tokens_per_s": b["tokens_per_s"],
                      **{f"engine_{i}_weight_version": v for i, v in sorted(b["versions"].items())}})
    if rank == 0:
        _record(config["out"], "history", lambda: history)
        print(f"reward by step: {' '.join(f'{x:.2f}' for x in history['reward'])}")


def engine_options(rollout, cpu: bool) -> tuple[dict, str]:
    """The Ray options of one rollout engine (one per host of the rollout group, holding that host's
    accelerators) and the device its torch engine would use."""
    if rollout.kind == "tpu":
        accel, device = {"resources": {"TPU": rollout.chips_per_host}}, "tpu"
    elif rollout.kind == "gpu":
        accel, device = {"num_gpus": rollout.gpus_per_host}, "cuda"
    else:
        accel, device = {}, "cpu"
    return {"num_cpus": 1, "label_selector": rollout.labels, **accel}, "cpu" if cpu else device


def run(args: argparse.Namespace):
    import ray
    from ray.train import RunConfig

    from tputorch import train

    groups = train.groups()
    rollout, reward_group = groups[args.rollout_group], groups[args.reward_group]
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    options, device = engine_options(rollout, args.cpu)
    if args.engine == "vllm":
        # On a CPU machine vLLM takes 90 % of the RAM for its KV cache unless told: a small one; and
        # it would compute a float32 model in bfloat16, unlike the trainer.
        extra = {"kv_cache_memory_bytes": 64 * 2**20, "dtype": "float32"} if args.cpu else {}
        engines = [ray.remote(VllmEngine).options(**options).remote(i, args.model, args.out, **extra)
                   for i in range(rollout.hosts)]
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(args.model).vocab_size
    else:
        engines = [ray.remote(TorchEngine).options(**options).remote(i, args.out, device) for i in range(rollout.hosts)]
        vocab = TOY_VOCAB
    scorer = ray.remote(Reward).options(num_cpus=1, label_selector=reward_group.labels).remote(args.out, vocab)
    config = {"steps": args.steps, "prompts": args.prompts, "group_size": args.group_size, "lr": args.lr,
              "answer_tokens": args.answer_tokens, "engine": args.engine, "model": args.model,
              "engines": engines, "reward": scorer, "out": args.out, "device": "cpu" if args.cpu else "tpu"}
    return trainer(args.cpu, config, RunConfig(storage_path=args.storage_path, name=args.name)).fit()


# ---- Where the policy trains: the only lines that differ between a TPU slice and --cpu ---------
# Both: one worker per chip of the training slice (train.scaling_config(), which keeps them there).
# TPU: TorchTrainer, device "tpu", process group tpu_dist (TorchTrainer's choice with use_tpu=True).
# --cpu: the same placement (each worker still owns its chip: TPU_VISIBLE_CHIPS), device "cpu" and a
# gloo group the script sets up itself: TorchTrainer would ask torch_tpu for the workers' device.
def trainer(cpu: bool, config: dict, run_config):
    from tputorch import train

    if cpu:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        return DataParallelTrainer(train_func, train_loop_config=config, scaling_config=train.scaling_config(),
                                   run_config=run_config)
    from ray.train.torch import TorchTrainer

    return TorchTrainer(train_func, train_loop_config=config, scaling_config=train.scaling_config(), run_config=run_config)
# -----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import ray

    args = parse_args(argv)
    ray.init()
    result = run(args)
    print(f"final metrics: {result.metrics}")
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
