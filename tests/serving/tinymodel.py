"""A tiny Llama model made here, nothing from a hub: a 2-layer config (hidden 128, 4 heads of 32:
vLLM's CPU attention refuses heads smaller than 32), random weights as safetensors, and a BPE
tokenizer trained with `tokenizers` on a few sentences, wrapped as a fast tokenizer with a chat
template. Runs in the serving venv (torch, transformers, tokenizers). ~30 s.

    python tests/serving/tinymodel.py OUT_DIR
"""

import sys
from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TEXT = ["A TPU slice is a set of TPU chips connected by a fast interconnect.",
        "Ray Serve runs models as deployments with replicas.",
        "vLLM batches requests and keeps a paged key value cache.",
        "Kubernetes schedules pods on nodes; KubeRay runs Ray clusters on Kubernetes."] * 50


def make(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=512, special_tokens=special,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
