"""One vLLM engine start with compilation on (not enforce_eager), run by the serving venv's Python
(tests/serving/test_compile_cache.py runs it twice on one VLLM_CACHE_ROOT). Prints one line,
COMPILE-CACHE {"init_s": ...}: the engine's start time, its first answer included."""

import json
import sys
import time


def main() -> None:
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams

    llm = LLM(model=sys.argv[1], enforce_eager=False, max_model_len=256, kv_cache_memory_bytes=64 * 2**20)
    llm.generate(["hello"], SamplingParams(max_tokens=2, temperature=0))
    print("COMPILE-CACHE " + json.dumps({"init_s": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it imports this module again
    main()
