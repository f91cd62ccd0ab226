"""A LoRA adapter for tinymodel.py's tiny Llama, made here: PEFT's layout (adapter_config.json and
adapter_model.safetensors with base_model.model.<module>.lora_A/lora_B weights) on q_proj and v_proj
of both layers, rank 8, with weights large enough that greedy decoding differs from the base
model's. Runs in the serving venv (torch, safetensors).

    python tests/serving/tinylora.py BASE_MODEL_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

RANK = 8
TARGETS = ("q_proj", "v_proj")


def make(base: Path, out: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1)
    weights = {}
    for layer in range(layers):
        for module in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(RANK, hidden) * 0.5
            weights[f"{prefix}.lora_B.weight"] = torch.randn(hidden, RANK) * 0.5
    save_file(weights, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base), "r": RANK,
        "lora_alpha": 2 * RANK, "lora_dropout": 0.0, "target_modules": list(TARGETS), "bias": "none",
        "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False, "use_dora": False}, indent=1))
    return out


if __name__ == "__main__":
    print(make(Path(sys.argv[1]), Path(sys.argv[2])))
