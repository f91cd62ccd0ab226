"""One vLLM engine start on a gs:// model with the Run:ai streamer, run by the serving venv's Python
(tests/serving/test_runai_streamer.py runs it against the stand-in GCS, fakegcs.py). The model goes
the way a TPUTorchService's does: Ray Serve LLM's LLMConfig from the operator's rendered
llm_config (argv[1], JSON), the model vLLM gets resolved by Ray 2.60's own code (for a streaming
load_format, the bucket URI rather than a local copy), then vLLM's engine on CPU. Prints one line,
RUNAI-STREAMER {"model": ..., "init_s": ..., "text": ...}.

Ray's engine wrapper is not started: the rest of it (a placement group, the engine in a Serve
replica) is what tests/cluster/test_real_serving.py runs, and it reads the model the same way."""

import json
import sys
import time


def resolved_model(llm_config: dict) -> str:
    """What Ray Serve LLM hands vLLM as the model for this llm_config (Ray 2.60's vllm_engine.py)."""
    from ray.llm._internal.serve.engines.vllm.vllm_engine import _resolve_hf_model_id_from_mirror
    from ray.serve.llm import LLMConfig

    engine_config = LLMConfig(**llm_config).get_engine_config()
    _resolve_hf_model_id_from_mirror(engine_config)
    return engine_config.actual_hf_model_id


def main() -> None:
    llm_config = json.loads(sys.argv[1])
    t0 = time.monotonic()
    model = resolved_model(llm_config)
    from vllm import LLM, SamplingParams

    # float32, the tiny model's own dtype (as weight_sync.py runs it): vLLM's CPU default, bfloat16,
    # takes oneDNN's AMX kernels, which a VM may advertise and still kill with SIGILL (exit -4; seen
    # on the 2026-12-07 CI machine). What is tested is the load path, not the arithmetic.
    llm = LLM(model=model, load_format=llm_config["engine_kwargs"]["load_format"], enforce_eager=True,
              max_model_len=256, kv_cache_memory_bytes=64 * 2**20, dtype="float32")
    init_s = time.monotonic() - t0
    out = llm.generate(["A TPU slice is"], SamplingParams(max_tokens=4, temperature=0))
    print("RUNAI-STREAMER " + json.dumps({"model": model, "init_s": round(init_s, 1),
                                          "text": out[0].outputs[0].text, "tokens": len(out[0].outputs[0].token_ids)}))


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it imports this module again
    main()
