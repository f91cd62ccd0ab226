"""The RL example's weight sync against a real vLLM engine (vLLM 0.29's CPU build), no Ray: run by
the serving venv's Python (tests/serving/test_weight_sync.py), prints one JSON object.

    python tests/serving/weight_sync.py MODEL_DIR

examples/rl/grpo.py's own VllmEngine and trainer-side functions, in one process:
1. the engine's greedy answers to a few prompts with the weights it started with (version -1);
2. the trainer's copy of the model (Hugging Face) trained a few Adam steps until its greedy answer to
   every prompt is one chosen token repeated (a token the engine did not answer before);
3. sync(those weights, version 1): the engine's greedy answers, to the same prompts (its prefix
   cache would still hold their old KV), and its version;
4. sync(the starting weights, version 2): its greedy answers and version again.
"""

import importlib.util
import json
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl" / "grpo.py"
PROMPTS = [[11, 12, 13, 14], [200, 201, 202, 203], [7, 300, 42, 99]]
TOKENS = 4


def load_example():
    spec = importlib.util.spec_from_file_location("grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_greedy(policy, prompts, tokens):
    import torch

    with torch.no_grad():
        ids = torch.tensor(prompts)
        for _ in range(tokens):
            ids = torch.cat([ids, policy(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[:, len(prompts[0]):].tolist()


def main(model: str) -> dict:
    import torch

    grpo = load_example()
    out: dict = {"timings": {}}
    t0 = time.monotonic()
    engine = grpo.VllmEngine(0, model, kv_cache_memory_bytes=64 * 2**20, dtype="float32")
    out["timings"]["engine_start_s"] = time.monotonic() - t0
    out["version_at_start"] = engine.version()
    out["before"] = engine.greedy(PROMPTS, TOKENS)

    policy, vocab = grpo.load_policy("vllm", model)
    start = grpo.cpu_state(policy)
    out["trainer_before"] = hf_greedy(policy, PROMPTS, TOKENS)
    seen = {t for answer in out["before"] + out["trainer_before"] for t in answer}
    target = next(t for t in range(vocab - 1, 0, -1) if t not in seen)
    opt = torch.optim.Adam(policy.parameters(), lr=0.01)
    for step in range(50):  # the trainer's model learns to answer `target`, as a GRPO step would push it
        loss = -grpo.answer_logprobs(policy, PROMPTS, [[target] * TOKENS] * len(PROMPTS), "cpu").mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hf_greedy(policy, PROMPTS, TOKENS) == [[target] * TOKENS] * len(PROMPTS):
            break
    out["target"], out["train_steps"] = target, step + 1
    out["trainer_after"] = hf_greedy(policy, PROMPTS, TOKENS)

    t1 = time.monotonic()
    out["sync_1"] = engine.sync(grpo.cpu_state(policy), 1)
    out["timings"]["sync_s"] = time.monotonic() - t1
    out["version_1"] = engine.version()
    out["after"] = engine.greedy(PROMPTS, TOKENS)
    out["sync_2"] = engine.sync(start, 2)
    out["version_2"] = engine.version()
    out["reverted"] = engine.greedy(PROMPTS, TOKENS)
    out["seen"] = engine.seen
    return out


if __name__ == "__main__":
    print("WEIGHT-SYNC " + json.dumps(main(sys.argv[1])), flush=True)
